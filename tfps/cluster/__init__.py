"""Running on a cluster: the strategy from TF_CONFIG (distribute), the local launcher
(`tfps-launch`) and its health checks of tasks."""
