"""The HTML view's inline stylesheet and script (no file or network is fetched by the page)."""

from __future__ import annotations

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 7px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2em 0; font: 13px/1.5 ui-monospace, monospace; }
.filters { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
.prompt { border-top: 1px solid #ddd; margin-top: 1em; } .text { margin: .5em 0 .9em; }
.who { font-weight: 600; } .who small { font-weight: 400; color: #666; }
.plots img { max-width: 48%; margin: .3em; border: 1px solid #eee; }
.bar { display: inline-block; height: .7em; background: #4a90d9; vertical-align: middle; margin-right: 4px; }
[hidden] { display: none !important; }
.o-t { background: #fff; } .o-none { color: #555; }
.o-b { background: #ffd866; }
.o-d1 { background: #d7f5d0; } .o-d2 { background: #b5ebc0; } .o-d3 { background: #92dfc0; }
.o-d4 { background: #74cfc8; } .o-d5 { background: #6dbbd8; } .o-d6 { background: #7aa6e3; }
.o-d7 { background: #9a95e6; } .o-d8 { background: #c08ae0; }
.legend span { padding: 1px 6px; margin-right: 4px; border: 1px solid #ddd; }
"""

# Filters: every element with data-drafter / data-category is hidden unless it matches the chosen drafter and
# category (an element without the attribute always matches); a prompt section with no visible answer is hidden.
# The initial choice may come from the address: page.html#drafter=NAME&category=NAME.
JS = """
(function () {
  var drafter = document.getElementById('filter-drafter'), category = document.getElementById('filter-category');
  function matches(el) {
    var d = el.getAttribute('data-drafter'), c = el.getAttribute('data-category');
    return (!drafter.value || d === null || d === '' || d === drafter.value) &&
           (!category.value || c === null || c === '' || c === category.value);
  }
  function apply() {
    document.querySelectorAll('[data-drafter], [data-category]').forEach(function (el) { el.hidden = !matches(el); });
    var shown = 0, total = 0;
    document.querySelectorAll('section.prompt').forEach(function (section) {
      var texts = section.querySelectorAll('.text'), visible = 0;
      texts.forEach(function (t) { if (!t.hidden && !section.hidden) visible++; });
      total += texts.length; shown += visible;
      if (!visible) section.hidden = true;
    });
    document.getElementById('shown').textContent = 'showing ' + shown + ' of ' + total + ' answers';
  }
  function choose(select, value) {
    for (var i = 0; i < select.options.length; i++) if (select.options[i].value === value) select.value = value;
  }
  var wanted = new URLSearchParams(location.hash.slice(1));
  if (wanted.has('drafter')) choose(drafter, wanted.get('drafter'));
  if (wanted.has('category')) choose(category, wanted.get('category'));
  drafter.addEventListener('change', apply); category.addEventListener('change', apply);
  apply();
})();
"""
