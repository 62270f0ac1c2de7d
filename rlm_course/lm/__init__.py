"""The language model (chapter 01; every later chapter trains, samples, measures or splits it):
the tiny decoder-only transformer with its KV cache and FLOP formula (:mod:`~rlm_course.lm.model`),
the character tokenizer (:mod:`~rlm_course.lm.tokenizer`), batched sampling and the scoring pass
(:mod:`~rlm_course.lm.sampling`), atomic checkpoints (:mod:`~rlm_course.lm.checkpoint`), and the
rollout engine's rounded copies (:mod:`~rlm_course.lm.precision`, chapter 13)."""
