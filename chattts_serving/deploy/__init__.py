"""Deployment: the model-repository renderer, the bundled tritonserver launcher and the health probe."""
