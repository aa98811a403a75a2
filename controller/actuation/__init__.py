"""Outbound actuation: decisions to the fleet over gRPC (grpc_actuator), dry-run recording (shadow),
and the KEDA external scaler (keda). Outcome types live in outcome.py and import no gRPC."""
