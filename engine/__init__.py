"""NInfer's inference engine: artifact, model, cache, scheduler, runner, sampling and serving."""
