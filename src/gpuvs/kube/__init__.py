"""Kubernetes through the official client: the connection (client.py) and one worker in one pod
(podrun.py). Imported only when a pod environment is used."""
