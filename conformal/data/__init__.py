"""The data layer of Conformal Privacy Auditing: linkage suites, synthetic benchmarks, dataset loaders.

* :class:`LinkageSuite` - released documents, true identities, the candidate pool and its profiles
  at one knowledge level (one declared threat configuration).
* Synthetic benchmarks (no download, no LLM): :func:`make_people`, :func:`synthetic_suite`,
  :func:`synthetic_ladder` (knowledge ladder K1/K2/K3 x releases direct / quasi_id_redaction /
  rewrite) and blog-style authors :func:`blog_suite`, :func:`blog_ladder` (W1/W3/W10/demo).
* Loaders of the published formats, from local paths: :func:`load_tab`, :func:`load_textwash`,
  :func:`load_wikibio`, :func:`load_blog_authorship`, and :func:`load_source`, the CPA run's
  adapter (``[data.<source>]`` parameters -> suites).

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Tables 4, 7 and 8.
"""

from conformal.data.loaders import (
    load_blog_authorship,
    load_source,
    load_tab,
    load_textwash,
    load_wikibio,
    parse_blog_xml,
    parse_wikibio_box,
    textwash_name_tokens,
)
from conformal.data.suite import LinkageSuite
from conformal.data.synthetic import (
    DocumentDraft,
    Person,
    draft_document,
    make_people,
    profile_text,
    render_document,
    synthetic_ladder,
    synthetic_suite,
)
from conformal.data.synthetic_blogs import BlogAuthor, blog_demo_profile, blog_ladder, blog_suite, make_blog_authors

__all__ = [
    "BlogAuthor",
    "DocumentDraft",
    "LinkageSuite",
    "Person",
    "blog_demo_profile",
    "blog_ladder",
    "blog_suite",
    "draft_document",
    "load_blog_authorship",
    "load_source",
    "load_tab",
    "load_textwash",
    "load_wikibio",
    "make_blog_authors",
    "make_people",
    "parse_blog_xml",
    "parse_wikibio_box",
    "profile_text",
    "render_document",
    "synthetic_ladder",
    "synthetic_suite",
    "textwash_name_tokens",
]
