// The page's linking script, run by a gr.HTML's js_on_load (dart_core/page/layout.py), so it runs wherever the
// page is served: hovering a node of a draft tree outlines the answer token it stands for. A tree figure's
// layout.meta says which answer element each answer position starts at (dart_core/page/render.py: _linked);
// its markers' customdata is [kind, index, position].
const bound = new WeakSet();
function tokenEls(engine) { return document.querySelectorAll('#answer-' + engine + ' .token'); }
function clear() { document.querySelectorAll('.token.dart-linked').forEach(e => e.classList.remove('dart-linked')); }
function bind(gd) {
  if (bound.has(gd) || typeof gd.on !== 'function') return;
  bound.add(gd);
  gd.on('plotly_hover', ev => {
    clear();
    const meta = (gd.layout && gd.layout.meta) || {};
    const pt = ev && ev.points && ev.points[0];
    const cd = pt && pt.customdata;
    if (!meta.engine || !Array.isArray(cd) || cd.length < 3) return;
    const first = (meta.token_elements || {})[String(cd[2])];
    const el = first === undefined ? null : tokenEls(meta.engine)[first];
    if (el) { el.classList.add('dart-linked'); el.scrollIntoView({block: 'nearest'}); }
  });
  gd.on('plotly_unhover', clear);
}
function scan() { document.querySelectorAll('[id^="tree-"] .js-plotly-plot').forEach(bind); }
new MutationObserver(scan).observe(document.body, {childList: true, subtree: true});
scan();

// A clicked answer token stays outlined while the step view shows its step (the click moves the answer-position
// slider there); moving the slider by hand, to another step, drops the outline.
function clearSelected() {
  document.querySelectorAll('.token.dart-selected').forEach(e => e.classList.remove('dart-selected'));
}
document.addEventListener('click', ev => {
  const t = ev.target.closest && ev.target.closest('[id^="answer-"] .token');
  if (!t) return;
  clearSelected();
  t.classList.add('dart-selected');
}, true);
document.addEventListener('input', ev => {
  if (ev.target.closest && ev.target.closest('#step-slider')) clearSelected();
}, true);
