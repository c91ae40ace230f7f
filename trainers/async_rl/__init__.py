"""Async GRPO: continuous rollout workers, generator replicas and the seeds' weight-sync modes."""
