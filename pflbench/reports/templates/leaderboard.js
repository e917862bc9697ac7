// Sorting (click a header; numbers first click descending), filtering (dataset, scheme, clients,
// algorithm, status) and the evaluation protocol switch (#f-protocol: only the tables whose
// data-protocol is the chosen one are shown; one protocol at a time, never "all"). The page state
// lives in the address's hash, e.g. index.html#protocol=adapted-final-clients&dataset=fmnist&sort=cells-acc&dir=asc,
// so a view can be linked and opened from disk. Sorting moves the rows of a table's first <tbody>
// only: reference rows (Centralized) stay apart, below, in their own <tbody>.
(function () {
  "use strict";
  function sortValue(cell) {
    if (!cell) return "";
    var value = cell.getAttribute("data-sort-value");
    return value === null ? cell.textContent.trim() : value;
  }
  function sortTable(th, wanted) {
    var table = th.closest("table");
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute("data-type") !== "text";
    var current = th.getAttribute("aria-sort");
    var dir = wanted || (current === "descending" ? "ascending" : current === "ascending" ? "descending"
                         : numeric ? "descending" : "ascending");
    Array.prototype.forEach.call(table.querySelectorAll("thead th"), function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir);
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = sortValue(a.cells[index]), y = sortValue(b.cells[index]);
      if (numeric) {
        var fx = parseFloat(x), fy = parseFloat(y);
        if (isNaN(fx) && isNaN(fy)) return 0;
        if (isNaN(fx)) return 1;   // missing, failed, diverged: always last
        if (isNaN(fy)) return -1;
        return dir === "ascending" ? fx - fy : fy - fx;
      }
      var c = x.localeCompare(y, undefined, {numeric: true});
      return dir === "ascending" ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    document.body.setAttribute("data-sorted", th.id || "");
  }
  var FILTERS = ["protocol", "dataset", "scheme", "clients", "algorithm", "status"];
  function readHash() {
    var state = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var kv = part.split("=");
      if (kv[0]) state[decodeURIComponent(kv[0])] = decodeURIComponent(kv.slice(1).join("=") || "");
    });
    return state;
  }
  function applyFilters() {
    var want = {};
    FILTERS.forEach(function (name) {
      var input = document.getElementById("f-" + name);
      if (input && input.value) want[name] = input.value;
    });
    Array.prototype.forEach.call(document.querySelectorAll(".flt"), function (el) {
      var show = true;
      FILTERS.forEach(function (name) {
        var have = el.getAttribute("data-" + name);
        if (!want[name] || have === null) return;
        if (name === "algorithm") show = show && have.toLowerCase().indexOf(want[name].toLowerCase()) >= 0;
        else show = show && have === want[name];
      });
      el.hidden = !show;
    });
    var state = readHash(), parts = [];
    FILTERS.forEach(function (name) { if (want[name]) state[name] = want[name]; else delete state[name]; });
    var protocol = document.getElementById("f-protocol");
    if (protocol && state.protocol === protocol.getAttribute("data-default")) delete state.protocol;
    Object.keys(state).forEach(function (k) { parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(state[k])); });
    if (history.replaceState) history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname);
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable thead th"), function (th) {
      th.addEventListener("click", function () { sortTable(th); });
    });
    var state = readHash();
    FILTERS.forEach(function (name) {
      var input = document.getElementById("f-" + name);
      if (!input) return;
      if (state[name] !== undefined) {
        input.value = state[name];
        if (input.tagName === "SELECT" && input.selectedIndex < 0) input.selectedIndex = 0;  // an unknown value
      }
      input.addEventListener(input.tagName === "SELECT" ? "change" : "input", applyFilters);
    });
    applyFilters();
    if (state.sort) {
      var th = document.getElementById(state.sort);
      if (th) {
        th.click();  // the same path as a user's click
        var dir = state.dir === "asc" ? "ascending" : state.dir === "desc" ? "descending" : null;
        if (dir && th.getAttribute("aria-sort") !== dir) th.click();
      }
    }
  });
})();
