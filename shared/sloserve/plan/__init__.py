"""BestServe planner (docs/papers.md): Estimator, fast simulators, Optimizer."""
