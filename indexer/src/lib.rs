//! kvindex: an exact prefix-cache index for vLLM fleets.
