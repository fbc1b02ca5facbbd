import torch
from pydantic import Field

from ..fl.state import State
from ..fl.train import ClientLoss, Phase
from .base import METHODS, Float, Method, Params as BaseParams


def proximal(anchor: State, weight: float) -> ClientLoss:
    """The Phase loss weight * ||w - anchor||^2 over the anchor's entries (FedProx, FedAMP)."""
    device = next(iter(anchor.values())).device
    inputs = {"weight": torch.tensor(float(weight), device=device), **{f"anchor.{k}": a for k, a in anchor.items()}}
    return ClientLoss(_proximal, inputs)


def proximal_phase(anchor: State, weight: float, epochs: int) -> Phase:
    """Training for `epochs` with the pull weight * ||w - anchor||^2 towards the anchor's entries
    (detached); plain training when there is no anchor or no weight (FedProx's mu = 0 is FedAvg)."""
    anchor = {key: t.detach() for key, t in anchor.items()}
    return Phase(epochs=epochs, loss=proximal(anchor, weight) if anchor and weight else None, loss_name="proximal")


def _proximal(params, batch, logits, inputs):
    # a module-level function of the client's inputs: equal for every client, so plans batch
    prefix = len("anchor.")
    return inputs["weight"] * sum(((params[key[prefix:]] - a) ** 2).sum()
                                  for key, a in inputs.items() if key != "weight")


@METHODS.register("fedprox", "FedProx (Li et al. 2020): FedAvg plus a proximal term mu/2 ||w - w_global||^2")
class FedProx(Method):
    class Params(BaseParams):
        mu: Float = Field(0.01, ge=0)

    hp: Params

    def plan(self, k, state, received):
        # The anchor is the global model as received this round; personal parameters (a local
        # head) have no global counterpart and are left unregularised.
        anchor = {key: t for key, t in received.items() if key in self.ctx.param_keys}
        return [proximal_phase(anchor, 0.5 * self.hp.mu, self.ctx.epochs)]
