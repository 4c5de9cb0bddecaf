"""What the page shows, without Gradio: run sessions, export / replay records, narration, figures,
start-up and Space settings, serving limits. ``app.py`` is the Gradio page over it."""
