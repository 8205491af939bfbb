"""Sphinx configuration of the flexibuff_envs documentation (built by ``make docs``)."""

from __future__ import annotations

import importlib.metadata

project = "flexibuff_envs"
author = "the flexibuff_envs developers"
copyright = f"2026, {author}"  # the footer's line
release = importlib.metadata.version("flexibuff_envs")
version = release

extensions = [
    "myst_parser",  # the pages are Markdown, as the README is
    "sphinx.ext.autodoc",  # the reference is the docstrings
    "sphinx.ext.napoleon",  # whose Args:/Returns:/Raises: sections are Google style
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # links to a page's sections, as GitHub makes them

# `name` in a docstring links to that object wherever it is documented, else stays code
default_role = "py:obj"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"flexibuff_envs {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # long code lines wrap (docs/_static/custom.css)
