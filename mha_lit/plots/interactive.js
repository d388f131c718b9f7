(() => {
  if (window.mhaAttnReady) return;
  window.mhaAttnReady = true;
  const cellOf = (e) =>
    e.target.closest && e.target.closest(".mha-attn rect[data-w]");
  const hide = (fig) => {
    fig.querySelector(".mha-attn-tip").hidden = true;
    fig.querySelectorAll("rect.mha-on")
       .forEach((r) => r.classList.remove("mha-on"));
  };
  const show = (cell) => {
    const fig = cell.closest(".mha-attn");
    const tip = fig.querySelector(".mha-attn-tip");
    const d = cell.dataset;
    hide(fig);
    cell.classList.add("mha-on");
    tip.textContent =
      `query \u201c${d.q}\u201d \u2192 key \u201c${d.k}\u201d\n` +
      (d.masked ? `masked: weight ${d.w}` : `weight ${d.w}`);
    tip.style.left = "0px";
    tip.hidden = false;
    const f = fig.getBoundingClientRect(), c = cell.getBoundingClientRect();
    const left = c.left - f.left + c.width / 2 - tip.offsetWidth / 2;
    const most = f.width - tip.offsetWidth;
    tip.style.left = `${Math.max(0, Math.min(left, most))}px`;
    const above = c.top - f.top - tip.offsetHeight - 4;
    tip.style.top = `${above >= 0 ? above : c.bottom - f.top + 4}px`;
  };
  const onCell = (e) => { const c = cellOf(e); if (c) show(c); };
  const offCell = (e) => {
    const c = cellOf(e);
    if (c) hide(c.closest(".mha-attn"));
  };
  document.addEventListener("pointerover", onCell);
  document.addEventListener("focusin", onCell);
  document.addEventListener("pointerout", offCell);
  document.addEventListener("focusout", offCell);
  document.addEventListener("click", (e) => {
    const button =
      e.target.closest && e.target.closest(".mha-attn-heads button");
    if (!button) return onCell(e);  // a tap on a touch screen
    const fig = button.closest(".mha-attn");
    fig.querySelectorAll(".mha-attn-heads button").forEach((b) =>
      b.setAttribute("aria-pressed", String(b === button)));
    fig.querySelectorAll(".mha-attn-panel").forEach((p) => {
      p.hidden = p.dataset.head !== button.dataset.head;
    });
    hide(fig);
  });
})();
