"""What the README tells users to type: MLflow's UI and server stay on localhost unless authenticated."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_mlflow_ui_and_server_commands_bind_to_localhost_unless_they_authenticate():
    commands = re.findall(r"^(?:MLFLOW_\w+=\S+ )?mlflow (?:ui|server)\b.*$", README, re.M)
    assert len(commands) >= 3  # the local UI, a cluster's server, the authenticated server
    for command in commands:
        assert "--host 127.0.0.1" in command or "--app-name basic-auth" in command, command
