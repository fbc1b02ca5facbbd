from .base import METHODS, Method


@METHODS.register("fedavg", "FedAvg (McMahan et al. 2017): sample-size weighted average of all shared parameters")
class FedAvg(Method):
    """Every hook of the base class is FedAvg's."""
