"""The Gradio page: the only part of dart_core that imports Gradio (the layers below it, dart_core.ui among them,
compute what it shows without it). ``app.py`` parses the flags and serves it.

- ``visualiser.py``: :class:`Visualiser`, the page for one loaded target: it builds the layout, constructs the
  parts below with what each needs and connects the events;
- ``layout.py`` (every component, returned as one ``PageComponents``), ``controls.py`` (the settings controls, the
  page's copy), and the parts that read and write the components: ``handlers.py`` (run, step once, the step view,
  stop, clear, export, replay), ``render.py`` (a RunRecord into the components), ``costs.py`` (the cost of a tree,
  why this speed) and ``trees.py`` (tree mode and presets);
- ``tabs.py``: each browser tab's state, its step-once session and the memory budget over all tabs;
- ``engines.py``: the engine pool (``EngineFactory``, ``EngineLease``): one run per engine at a time;
- ``startup.py``: the start-up log lines and the warm-up; ``serve.py``: launch() and the wait for the page;
- ``link.js``: the script that links a hovered tree node to its answer token.
"""
