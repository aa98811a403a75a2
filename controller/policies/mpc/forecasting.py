"""The MPC policy's load forecast: the prior and the learned forecaster, validated against each other online.

Every tick both forecasters forecast the fleet's demand (when a learned model is loaded: the
daemon's model slot, or the bench's shipped models/). Their p50s at the validation lead — the
lead nearest the fleet's slowest cold start-up, the load a replica ordered now will meet — are
remembered with their p90s, and so are those at the plan's first step (the load the
replicas of this tick meet), and scored when that time comes, against the demand then read
(`Scoreboard`). The score is the quantile (pinball) loss at the two quantiles the plan consumes,
p50 and p90: a smooth p50 with a band too narrow for the bursts loses to a wider one, which a
mean absolute error of the p50 alone would not see. The plan uses the learned forecast only once
it has been scored `MIN_SCORED` times and its loss is below the prior's by `LEARNED_MARGIN`;
otherwise the prior (which needs no fitting) is used. A learned model fitted on other traffic,
or a time-compressed bench trace it does not fit, is thus never planned on.

The chosen forecast's p90 is then widened to what its own measured error says
(`widen_to_error`): for normally distributed errors the p90 lies 1.28 σ above the p50 and the
mean absolute error is 0.80 σ, so p90 − p50 ≥ 1.6 × MAE at the validation lead, scaled by
√(lead / validation lead) at shorter leads (errors of a level forecast grow like a random walk's
over the short leads a plan spans) and held at the validation lead's beyond it. The MAE is one EWMA
over the scores of both leads remembered, the first step's and the validation lead's (from the first
tick until a validation lead has passed, the first step's alone), so it reads below the validation
lead's own error where the first step's is smaller: keeping them apart was tried and not kept
(decision 0034: a wider margin everywhere, no passes gained on held-out cases).

Must not: do I/O, read a clock, or keep state outside the frozen `Scoreboard` it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from controller.core.forecast import Forecaster, LoadForecast

# scored forecasts needed before the learned forecaster may be chosen: with errors correlated over
# a start-up-long lead, 20 scores at 15 s ticks span 5 minutes, a few independent horizons
MIN_SCORED = 20
# the learned forecast must beat the prior by this much: the two error estimates are themselves
# noisy, and switching back and forth on noise would make the plan jump
LEARNED_MARGIN = 0.05
# EWMA weight of a new error: 2 / (N + 1) with N = 40 scores (10 minutes of 15 s ticks)
ERROR_ALPHA = 2.0 / 41.0
# p90 − p50 of a normal error is 1.2816 σ; its mean absolute error is √(2/π) σ = 0.7979 σ
P90_OVER_MAE = 1.2816 / 0.7979
PENDING_KEEP = 256  # forecasts awaiting their score (a 30-minute lead at 15 s ticks is 120)


@dataclass(frozen=True)
class Scoreboard:
    """Online scores of the two forecasters at the validation lead (frozen; carried in MpcState).

    `*_loss`: EWMA of the pinball losses at 0.5 and 0.9 (req/s); `*_ae`: EWMA of |p50 − actual|
    (req/s), what the p90 is widened by; both over the first step's scores and the validation lead's."""

    pending: tuple[tuple[float, float, float, float, float], ...] = ()  # due_s, prior p50/p90, learned p50/p90
    prior_loss: float | None = None
    learned_loss: float | None = None
    prior_ae: float | None = None
    learned_ae: float | None = None
    scored: int = 0  # scores of the learned forecaster (the prior is scored with it, or alone)
    prior_scored: int = 0

    def learned_wins(self) -> bool:
        return (self.learned_loss is not None and self.prior_loss is not None and self.scored >= MIN_SCORED
                and self.learned_loss < (1.0 - LEARNED_MARGIN) * self.prior_loss)

    def to_dict(self, method: str) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"method": method, "prior_loss_rps": r(self.prior_loss), "learned_loss_rps": r(self.learned_loss),
                "prior_ae_rps": r(self.prior_ae), "learned_ae_rps": r(self.learned_ae),
                "scored": self.scored, "prior_scored": self.prior_scored}


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - ERROR_ALPHA) * old + ERROR_ALPHA * new


def pinball(q: float, pred: float, actual: float) -> float:
    """The quantile loss of `pred` as the q-quantile: q × under-forecast, (1 − q) × over-forecast."""
    d = actual - pred
    return q * d if d >= 0 else (q - 1.0) * d


def quantile_loss(p50: float, p90: float, actual: float) -> float:
    return pinball(0.5, p50, actual) + pinball(0.9, p90, actual)


def settle(board: Scoreboard, now_s: float, actual: float | None) -> Scoreboard:
    """Score every remembered forecast that has come due against this tick's demand reading."""
    if actual is None or not math.isfinite(actual):
        return board
    b = board
    keep = []
    for row in board.pending:
        due, p50, p90, l50, l90 = row
        if due > now_s:
            keep.append(row)
            continue
        b = replace(b, prior_loss=_ewma(b.prior_loss, quantile_loss(p50, p90, actual)),
                    prior_ae=_ewma(b.prior_ae, abs(p50 - actual)), prior_scored=b.prior_scored + 1)
        if math.isfinite(l50):
            b = replace(b, learned_loss=_ewma(b.learned_loss, quantile_loss(l50, l90, actual)),
                        learned_ae=_ewma(b.learned_ae, abs(l50 - actual)), scored=b.scored + 1)
    return replace(b, pending=tuple(keep))


def validation_index(lead_s: np.ndarray, startup_s: float) -> int:
    """The lead the forecasters are scored at: the one nearest the slowest cold start-up."""
    if len(lead_s) == 0:
        return -1
    return int(np.argmin(np.abs(lead_s - startup_s)))


def widen_to_error(fc: LoadForecast, mae: float | None, validation_lead_s: float) -> LoadForecast:
    """p90 at least p50 + 1.6 × the measured MAE (see the module docstring); unchanged without a score."""
    if mae is None or not math.isfinite(mae) or mae <= 0 or validation_lead_s <= 0:
        return fc
    scale = np.sqrt(np.minimum(np.maximum(fc.lead_s, 0.0) / validation_lead_s, 1.0))
    p90 = np.maximum(fc.p90, fc.p50 + P90_OVER_MAE * mae * scale)
    return replace(fc, p90=p90)


def forecast(prior: Forecaster, learned: Forecaster | None, board: Scoreboard, t_hist: np.ndarray,
             d_hist: np.ndarray, now_s: float, lead_s: np.ndarray, startup_s: float,
             actual: float | None) -> tuple[LoadForecast, Scoreboard, str]:
    """(the forecast to plan on, the scoreboard with this tick's forecasts remembered, the method used)."""
    board = settle(board, now_s, actual)
    fc_prior = prior.forecast(t_hist, d_hist, now_s, lead_s)
    fc_learned = learned.forecast(t_hist, d_hist, now_s, lead_s) if learned is not None else None
    k = validation_index(lead_s, startup_s)
    if k >= 0 and len(t_hist):
        rows = []
        for i in sorted({0, k}):  # the plan's first step and the validation lead
            l50, l90 = ((float(fc_learned.p50[i]), float(fc_learned.p90[i])) if fc_learned is not None
                        else (math.nan, math.nan))
            rows.append((now_s + float(lead_s[i]), float(fc_prior.p50[i]), float(fc_prior.p90[i]), l50, l90))
        board = replace(board, pending=(board.pending + tuple(rows))[-PENDING_KEEP:])
    use_learned = fc_learned is not None and board.learned_wins()
    chosen, mae, method = ((fc_learned, board.learned_ae, "learned") if use_learned and fc_learned is not None
                           else (fc_prior, board.prior_ae, "prior"))
    lead_k = float(lead_s[k]) if k >= 0 else 0.0
    return widen_to_error(chosen, mae, lead_k), board, method


__all__ = ["MIN_SCORED", "Scoreboard", "forecast", "pinball", "quantile_loss", "settle", "validation_index",
           "widen_to_error"]
