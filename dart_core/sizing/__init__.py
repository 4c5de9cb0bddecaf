"""Trees sized by measurement: a cost model of this machine (``costs``), an acceptance model of each
drafter (``acceptance``), the settings each drafter can take (``spaces``) and the drafter wrapper that
picks the setting with the most expected tokens per second (``auto.AutoTree``)."""
