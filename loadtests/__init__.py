"""Load tests (locust) and the CPU sizing report for render-service and `vllm launch render`."""
