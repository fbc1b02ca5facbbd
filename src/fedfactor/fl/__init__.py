"""The federated simulator: state helpers, communication meter, local training, the round loop."""
