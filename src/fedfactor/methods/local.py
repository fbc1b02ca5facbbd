from .base import METHODS, Method


@METHODS.register("local", "Stand-Alone: every client trains only on its own data and shares nothing")
class Local(Method):
    def shared_keys(self):
        return []
