"""A Sphinx extension with the book's fixes to what the HTML builder writes (``_config.yml``:
``sphinx: extra_extensions``).

* **One copy of each script.** sphinx-thebe adds its configuration script (``const THEBE_JS_URL
  = ...``) once each time Jupyter Book sets it up, and Jupyter Book sets it up twice, so every
  page declared the constant twice and the browser logged a SyntaxError. Scripts with the same
  file and the same inline body are written once.
"""
from __future__ import annotations


def one_of_each_script(app, pagename, templatename, context, doctree) -> None:
    """Drop a script that the page already loads (same file, same inline body)."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (str(script), getattr(script, "attributes", {}).get("body"))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", one_of_each_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
