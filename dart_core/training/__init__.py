"""Training pipelines for draft heads (DART; EAGLE-3 shares data, vocabulary, features, schedule, checkpoints).

    data.py        the self-distillation corpus (rows of prompt_ids + response_ids), splits, batches
    vocab.py       the draft vocabulary: the most frequent response tokens -> d2t / t2d
    features.py    the target's aux features and (draft-vocabulary) distributions for a sequence
    schedule.py    AdamW, cosine schedule with warmup, time-budget planning
    checkpoint.py  atomic checkpoint directories, the trainer state in them (read as plain data), resume
    run_config.py  the flags every trainer shares (BaseTrainConfig) and TrainError
    method.py      what differs between trainers (TrainMethod) and what a run resolved (Runtime)
    stats.py       per-level hit@1 / hit@10 / cross-entropy statistics
    ranks.py       the torchrun ranks (gloo on CPUs, NCCL on GPUs) and the collectives the run needs
    runner.py      the run both trainers share: plan (flags, data, head, schedule), loop (steps, budget,
                   checkpoints), finish (evaluation, head, summary, model card)
    dart_trainer.py  prefix-shared masked DART training + final evaluation
    eagle3_trainer.py  EAGLE-3 training-time test (7 unrolled steps) + final evaluation
    regenerate.py  rebuild the distillation corpus from prompts (the target's own greedy answers)

Command line: ``python -m dart_core.train dart --help``, ``python -m dart_core.train eagle3 --help``.
"""
