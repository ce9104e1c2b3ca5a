"""Plans, dollars, prediction intervals (and the published runs behind them), the Python API."""
