"""A Sphinx extension with the book's fixes to what the HTML builder writes (``_config.yml``:
``sphinx: extra_extensions``).

* **One copy of each script.** sphinx-thebe's configuration script (``const THEBE_JS_URL =
  ...``) reaches every page twice (once with the file name ``None``, once with ``""``), so the
  page declared the constant twice and the browser logged a SyntaxError. Scripts with the same
  file (no file counting as one) and the same inline body are written once.
"""
from __future__ import annotations


def one_of_each_script(app, pagename, templatename, context, doctree) -> None:
    """Drop a script that the page already loads (same file, same inline body)."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        name = getattr(script, "filename", script) or ""          # None and "": no file
        key = (str(name), tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", one_of_each_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
