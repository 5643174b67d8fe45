"""The tuner: the best vLLM flags for an SLO in a few launches, not a grid (issue 18).

- :mod:`app.tuner.space`: the search space (the split of the cards into tensor ×
  pipeline × data parallel, the checkpoints, ``max_num_batched_tokens``,
  ``kv_cache_dtype``, CUDA graphs, flags the user ticks) and the planner's pruning,
  each pruned value with its reason; ``gpu_memory_utilization`` the largest that fits
  with the planner's margin, never a grid; ``max_num_seqs`` from the measured capacity.
- :mod:`app.tuner.model`: the rig model — each candidate's users at the SLO predicted
  by the step-level engine (:func:`app.planner.predict.predict_ramp` of the capacity
  search), with the step-time terms scaled by factors fitted jointly to every
  measurement so far (:func:`app.planner.calibrate.fit_factors`).
- :mod:`app.tuner.tune`: measure, calibrate, re-rank — launch the best predicted
  configuration through the run controller, run the capacity search, refit, and launch
  the next only while a candidate is predicted to beat the best measured one by more
  than its measured spread; then confirm the recommendation (with its ``max_num_seqs``)
  in a final launch. State in the run store: an interrupted tune resumes.
"""
