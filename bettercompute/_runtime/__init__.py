"""The runtime every module runs on: declarations, the registry, calls, HTTP, jobs, workers and workflows."""
