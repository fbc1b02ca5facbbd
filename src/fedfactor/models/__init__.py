"""Model registry: `build_model(name, channels, height, width, num_classes)`."""

from .nets import MODELS, HeadedModel, build_model, resnet9_min_input

__all__ = ["MODELS", "HeadedModel", "build_model", "resnet9_min_input"]
