"""The autoscaling study's parts: Kubernetes' HPA controller on a virtual clock (hpa.py)."""
