// MathJax 3, served from the site (javascripts/mathjax/, copied by docs/hooks/offline_assets.py).
//
// Two sources of maths: Markdown pages and API pages, where pymdownx.arithmatex wraps each
// formula in an element of class "arithmatex" as \(...\) or \[...\]; and the tutorial
// notebooks, whose Markdown cells keep $...$ and $$...$$. Inside the page content (md-typeset)
// only those elements are searched, so a dollar sign in code output is never read as maths.
window.MathJax = {
  loader: { load: ["[tex]/textmacros"] },
  tex: {
    // textmacros: \_ and friends inside \text{...} (e.g. \text{learning\_rate})
    packages: { "[+]": ["textmacros"] },
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: "md-typeset",
    processHtmlClass: "arithmatex|jp-MarkdownOutput",
  },
};

// MathJax typesets the first page itself once loaded; typeset again whenever Material swaps
// the page content in place.
document$.subscribe(() => {
  if (window.MathJax && typeof MathJax.typesetPromise === "function") {
    MathJax.typesetPromise();
  }
});
