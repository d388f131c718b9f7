/* The book's layout on any width: what a style sheet alone cannot measure.
 *
 * - A table wider than its box is set as cards, one card per row, each cell labelled with its
 *   column's heading: on a phone no column hides off-screen.
 * - A display equation whose number would sit on the formula gets its number on a line of its
 *   own, below the formula.
 * - A box that scrolls sideways (a wide equation, a printed array, a wide figure) fades at the
 *   edge where more of it lies, so the reader sees that it scrolls.
 * - A figure is never drawn at less than FIGURE_SCALE of its own size, so that its smallest
 *   text (7 pt at 100 dpi, 9.7 px) keeps 6 px on a phone; a wider figure scrolls, and a tap on
 *   it opens the image at full size (book/_ext/figure_links.py makes each image a link).
 *
 * All of it runs once the page has loaded, again when MathJax has typeset the formulas (they
 * change the widths of equations and tables) and when the fonts have loaded, and whenever the
 * window or the article changes width.
 * Before printing, every folded code cell is opened (and folded again after): book.css sets
 * the rest of the printed page.
 */
(() => {
  "use strict";
  const FIGURE_SCALE = 0.62;
  const SCROLLERS = "div.math, div.cell_output pre, a.mha-figure-link, " +
                    ".pst-scrollable-table-container, .table-wrapper";

  // Each body cell gets a copy of its column's heading, shown only when the table is cards; a
  // copy is hidden from screen readers, which read the table's own headings.
  function labelTables(article) {
    for (const table of article.querySelectorAll("table")) {
      const heads = [...table.querySelectorAll("thead th")];
      if (!heads.length) continue;
      table.classList.add("mha-labelled");
      for (const row of table.querySelectorAll("tbody tr")) {
        [...row.children].forEach((cell, i) => {
          if (!heads[i] || cell.querySelector(":scope > .mha-card-label")) return;
          const label = document.createElement("span");
          label.className = "mha-card-label";
          label.setAttribute("aria-hidden", "true");
          for (const node of heads[i].childNodes) label.appendChild(node.cloneNode(true));
          cell.prepend(label);
        });
      }
    }
  }

  function fitTables(article) {
    for (const table of article.querySelectorAll("table.mha-labelled")) {
      table.classList.remove("mha-cards");
      const box = table.parentElement;
      if (table.getBoundingClientRect().width > box.clientWidth + 1) {
        table.classList.add("mha-cards");
      }
    }
  }

  function placeEquationNumbers(article) {
    for (const equation of article.querySelectorAll("div.math")) {
      const number = equation.querySelector(":scope > span.eqno");
      const formula = equation.querySelector("mjx-container mjx-math");
      if (!number || !formula) continue;
      equation.classList.remove("mha-number-below");
      const n = number.getBoundingClientRect();
      const f = formula.getBoundingClientRect();
      const line = equation.clientWidth;
      if (f.right > n.left - 8 || f.width > line - 2 * n.width - 16) {
        equation.classList.add("mha-number-below");
      }
    }
  }

  function keepFiguresLegible(article) {
    for (const img of article.querySelectorAll("a.mha-figure-link > img")) {
      const size = () => img.style.setProperty(
        "--mha-figure-min", `${Math.ceil(FIGURE_SCALE * img.naturalWidth)}px`);
      if (img.complete && img.naturalWidth) size();
      else img.addEventListener("load", () => { size(); layout(); }, {once: true});
    }
  }

  function markScrolling(element) {
    const more = element.scrollWidth - element.clientWidth;
    element.classList.toggle("mha-more-right", more > 1 && element.scrollLeft < more - 1);
    element.classList.toggle("mha-more-left", more > 1 && element.scrollLeft > 1);
  }

  function layout() {
    const article = document.querySelector("article.bd-article");
    if (!article) return;
    fitTables(article);
    placeEquationNumbers(article);
    for (const element of article.querySelectorAll(SCROLLERS)) markScrolling(element);
  }

  // Paper cannot unfold: open every folded code cell before printing, fold them again after.
  function unfoldForPrinting(article) {
    let opened = [];
    window.addEventListener("beforeprint", () => {
      opened = [...article.querySelectorAll("details:not([open])")];
      for (const details of opened) details.open = true;
    });
    window.addEventListener("afterprint", () => {
      for (const details of opened) details.open = false;
      opened = [];
    });
  }

  function start() {
    const article = document.querySelector("article.bd-article");
    if (!article) return;
    labelTables(article);
    keepFiguresLegible(article);
    unfoldForPrinting(article);
    article.addEventListener("scroll", (event) => {
      if (event.target.matches && event.target.matches(SCROLLERS)) markScrolling(event.target);
    }, {capture: true, passive: true});
    layout();
    let pending = 0;
    const later = () => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(layout);
    };
    window.addEventListener("resize", later);
    // The article can change width with no resize of the window: a widened window shows the
    // sidebar a moment later, and the article narrows then.
    let width = article.clientWidth;
    if (window.ResizeObserver) {
      new ResizeObserver(() => {
        if (article.clientWidth !== width) {
          width = article.clientWidth;
          later();
        }
      }).observe(article);
    }
    // An opened toggle (a solution, a hidden cell) shows boxes that were not laid out.
    article.addEventListener("toggle", layout, {capture: true});
    article.addEventListener("click", () => requestAnimationFrame(layout));
    window.addEventListener("load", () => {
      layout();
      if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        MathJax.startup.promise.then(layout);
      }
      if (document.fonts) document.fonts.ready.then(layout);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
