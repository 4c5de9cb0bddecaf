"""Training pipelines for draft heads (DART; EAGLE-3 shares data, vocabulary, features, schedule, checkpoints).

    data.py        the self-distillation corpus (rows of prompt_ids + response_ids), splits, batches
    vocab.py       the draft vocabulary: the most frequent response tokens -> d2t / t2d
    features.py    the target's aux features and (draft-vocabulary) distributions for a sequence
    schedule.py    AdamW, cosine schedule with warmup, time-budget planning
    checkpoint.py  atomic checkpoint directories, resume
    runner.py      the run loop both trainers share (budget, checkpoints, resume, log, eval, model-card pieces)
    dart_trainer.py  prefix-shared masked DART training + final evaluation
    eagle3_trainer.py  EAGLE-3 training-time test (7 unrolled steps) + final evaluation
    regenerate.py  rebuild the distillation corpus from prompts (the target's own greedy answers)

Command line: ``python -m dart_core.train dart --help``, ``python -m dart_core.train eagle3 --help``.
"""
