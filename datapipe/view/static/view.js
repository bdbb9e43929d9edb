// datapipe view: the only script. Drag across a histogram to filter the documents to that range
// (the bars are plain links too, so the page works without it). It reads nothing of the run and
// writes no page content: it only navigates to a URL built from the chart's own data attributes.
"use strict";
(function () {
  function valueAt(svg, x) {
    var left = Number(svg.dataset.left), right = Number(svg.dataset.right);
    var log = svg.dataset.log === "1";
    var lo = Number(svg.dataset.lo), hi = Number(svg.dataset.hi);
    var f = function (v) { return log ? Math.log10(1 + Math.max(v, 0)) : v; };
    var t = Math.min(Math.max((x - left) / (right - left), 0), 1);
    var v = f(lo) + t * (f(hi) - f(lo));
    return log ? Math.pow(10, v) - 1 : v;
  }
  function pretty(v) {
    if (Math.abs(v) >= 100) return String(Math.round(v));
    return String(Number(v.toPrecision(4)));
  }
  function svgX(svg, evt) {
    var box = svg.getBoundingClientRect();
    return (evt.clientX - box.left) * (svg.viewBox.baseVal.width / box.width);
  }
  document.querySelectorAll("svg.histogram").forEach(function (svg) {
    var start = null, brush = null, moved = false;
    svg.addEventListener("mousedown", function (evt) {
      if (evt.button !== 0) return;
      evt.preventDefault();
      start = svgX(svg, evt);
      moved = false;
      brush = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      brush.setAttribute("class", "brush");
      brush.setAttribute("y", "0");
      brush.setAttribute("height", svg.viewBox.baseVal.height);
      brush.setAttribute("x", start);
      brush.setAttribute("width", "0");
      svg.appendChild(brush);
    });
    window.addEventListener("mousemove", function (evt) {
      if (start === null) return;
      var x = svgX(svg, evt);
      if (Math.abs(x - start) > 3) moved = true;
      brush.setAttribute("x", Math.min(start, x));
      brush.setAttribute("width", Math.abs(x - start));
    });
    window.addEventListener("mouseup", function (evt) {
      if (start === null) return;
      var x = svgX(svg, evt), a = start;
      start = null;
      if (!moved) { brush.remove(); return; }  // a click: the bar's link does it
      var lo = valueAt(svg, Math.min(a, x)), hi = valueAt(svg, Math.max(a, x));
      var col = svg.dataset.column;
      var url = new URL(svg.dataset.base, window.location.href);
      url.searchParams.delete("after");
      url.searchParams.set("hist", col);
      url.searchParams.set(col + "_min", pretty(lo));
      url.searchParams.set(col + "_max", pretty(hi));
      window.location.assign(url.toString());
    });
    // a click that ended a drag must not also follow the bar's link
    svg.addEventListener("click", function (evt) { if (moved) { evt.preventDefault(); moved = false; } }, true);
  });
})();
