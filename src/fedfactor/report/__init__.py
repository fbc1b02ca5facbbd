"""Tables and figures from run outputs (summary.json and metrics.csv files)."""
