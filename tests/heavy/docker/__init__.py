"""The deployment files in docker/."""
