"""Kubernetes manifests of the train task: builders (spec -> operator arguments) and render."""
