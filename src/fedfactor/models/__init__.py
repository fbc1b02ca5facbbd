"""Model registry: `build_model(name, channels, height, width, num_classes, pretrained)`; layer numbering."""

from .layers import resolve_layers, unit_entries, weight_layers
from .registry import MODELS, HeadedModel, build_model
from .nets import resnet9_min_input  # importing nets registers resnet9, cnn, cnn_bn, mlp
from .vision import femnist_cnn_min_input  # importing vision registers resnet18, vgg16, femnist_cnn
from . import resnets  # noqa: E402,F401  registers resnet8, resnet10 (FedDecomp) and their CIFAR-stem forms
from . import text  # noqa: E402,F401  registers char_lstm (FedFac's Shakespeare model)

__all__ = ["MODELS", "HeadedModel", "build_model", "femnist_cnn_min_input", "resnet9_min_input", "resolve_layers",
           "unit_entries", "weight_layers"]
