"""What the page shows, without Gradio: run sessions, export / replay records, narration, figures,
start-up, serving limits. ``app.py`` is the Gradio page over it."""
