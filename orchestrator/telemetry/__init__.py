"""Time series sampled during a trial on one clock (epoch seconds): server /metrics, GPU NVML."""
