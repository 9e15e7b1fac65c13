"""Fakes of RunPod services for tests."""
