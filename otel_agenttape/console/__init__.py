"""The web console: a Starlette app (``app.create_app``) serving a text-only page and a read API over the
read model; ``agenttape console`` serves it alone (``serve.serve``). See docs/console.md."""
