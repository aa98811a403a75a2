"""The operator API: PolicyService server (server), persistent state on SQLite (store) and the CLI
commands that call it (client). Its gRPC plumbing (TLS, bearer tokens, health) is `controller.rpc.transport`,
shared with actuation/; the two never import each other."""
