from .base import Method
from . import METHODS


@METHODS.register("fedprox", "FedProx (Li et al. 2020): FedAvg plus a proximal term mu/2 ||w - w_global||^2")
class FedProx(Method):
    name = "fedprox"
    defaults = {"mu": 0.01}

    def local_train(self, k, received):
        named = dict(self.ctx.model.named_parameters())
        # The anchor is the global model as received this round; personal parameters (a local
        # head) have no global counterpart and are left unregularised.
        anchor = [(named[key], t.detach()) for key, t in received.items() if key in named]

        def proximal(model):
            return 0.5 * self.hp.mu * sum(((p - a) ** 2).sum() for p, a in anchor)

        return self.ctx.train(k, self.ctx.parameters(), self.ctx.epochs, loss_term=proximal if anchor else None)
