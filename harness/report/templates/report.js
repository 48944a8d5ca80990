(function () {
  "use strict";
  var wrap = document.getElementById("filter-wrap");
  var box = document.getElementById("filter");
  var count = document.getElementById("filter-count");
  if (!wrap || !box) { return; }
  wrap.hidden = false;
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr.test-row"));
  box.addEventListener("input", function () {
    var query = box.value.trim().toLowerCase();
    var shown = 0;
    rows.forEach(function (row) {
      var hit = !query || row.textContent.toLowerCase().indexOf(query) !== -1;
      row.hidden = !hit;
      if (hit) { shown += 1; }
    });
    if (query) {
      document.querySelectorAll("details.quiet").forEach(function (d) { d.open = true; });
    }
    count.textContent = query ? shown + " of " + rows.length + " rows" : "";
  });
})();
