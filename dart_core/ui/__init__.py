"""What the page shows, without Gradio: run sessions, export / replay records, narration, figures, serving
limits. ``dart_core.page`` is the Gradio page over it."""
