/* The attention explorers of book/explorer.md (the Transformer) and book/explorer_bahdanau.md
   (the GRU of chapter 2): every attention weight of a trained translator on 20 test sentences,
   as a heatmap. Plain JavaScript and SVG, no library, no request to any host. Each
   <div class="attn-explorer" data-source="NAME"> shows the data of window.NAME (default
   ATTNBOOK_ATTENTION), set by a .js file that `python -m attnbook.explorer` writes (attention.js,
   bahdanau.js) and the page loads with a <script> tag, so that it also works when opened from
   disk (file://), where browsers refuse to fetch a JSON file. A control with one choice (the
   GRU's one kind, layer and head; the translator page's one sentence) is hidden; the translator
   page (book/_static/translator/page.js) draws its maps with window.attnbookExplorer. */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  // viridis, as in attnbook/book/explorer.py: colour-blind safe, from dark purple (0) to yellow (1)
  var VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962",
                 "#addc30", "#fde725"];
  var CELL = 22;          // px per cell
  var BARS = 44;          // px of the bar chart of the highlighted row's weights
  var READS = 0.1;        // a key whose weight is at least this is "read" (highlighted)
  var ROWS_TEXT = {
    enc: "Rows (queries) and columns (keys): the German source pieces.",
    dec: "Rows (queries) and columns (keys): the decoder's input pieces, <s> and the " +
         "translation. A position sees only itself and earlier ones: the blank triangle is " +
         "the future, hidden by the causal mask.",
    cross: "Rows: the English piece that each decoder position predicts (its input is the " +
           "piece before it). Columns (keys): the German source pieces."
  };

  function colour(w) {
    var x = Math.min(Math.max(w, 0), 1) * (VIRIDIS.length - 1);
    var i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i, out = "#";
    for (var j = 1; j < 7; j += 2) {
      var a = parseInt(VIRIDIS[i].slice(j, j + 2), 16), b = parseInt(VIRIDIS[i + 1].slice(j, j + 2), 16);
      out += ("0" + Math.round(a * (1 - f) + b * f).toString(16)).slice(-2);
    }
    return out;
  }

  function el(name, attrs, parent, ns) {
    var e = ns ? document.createElementNS(SVG, name) : document.createElement(name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function svgText(parent, attrs, text) {
    var t = el("text", attrs, parent, true);
    t.textContent = text;
    return t;
  }

  function select(parent, name, label, options) {
    var wrap = el("label", {"class": "attn-control attn-" + name}, parent);
    wrap.appendChild(document.createTextNode(label + " "));
    var s = el("select", {"name": name, "aria-label": label}, wrap);
    options.forEach(function (o) {
      var opt = el("option", {value: o[0]}, s);
      opt.textContent = o[1];
    });
    return s;
  }

  function short(text, n) { return text.length > n ? text.slice(0, n - 1) + "\u2026" : text; }
  function fmt(w) { return w.toFixed(3); }

  var uid = 0;

  function init(root) {
    var me = ++uid;
    var source = root.getAttribute("data-source") || "ATTNBOOK_ATTENTION";
    var data = window[source];
    var status = el("p", {"class": "attn-status", "aria-live": "polite"});
    if (!data) {
      status.textContent = "The explorer's data (" + source.replace("ATTNBOOK_", "").toLowerCase() +
        ".js) did not load.";
      root.appendChild(status);
      return;
    }
    var controls = el("div", {"class": "attn-controls"}, root);
    var sentence = select(controls, "sentence", "Sentence", data.sentences.map(function (s, i) {
      return [i, "no. " + s.index + ": " + short(s.source, 48)];
    }));
    var kind = select(controls, "kind", "Attention", Object.keys(data.kinds).map(function (k) {
      return [k, data.kinds[k].name];
    }));
    var layers = [], heads = data.heads > 1 ? [["mean", "mean of heads"]] : [];
    for (var l = 0; l < data.layers; l++) layers.push([l, String(l + 1)]);
    for (var h = 0; h < data.heads; h++) heads.push([h, "head " + (h + 1)]);
    var layer = select(controls, "layer", "Layer", layers);
    var head = select(controls, "head", "Head", heads);
    kind.value = data.kinds.cross ? "cross" : Object.keys(data.kinds)[0];
    layer.value = String(data.layers - 1);
    [sentence, kind, layer, head].forEach(function (s) {   // nothing to choose: the GRU's one
      if (s.options.length < 2) s.parentNode.hidden = true;      // attention, the page's one sentence
    });
    var single = data.layers === 1 && data.heads === 1;

    var texts = el("dl", {"class": "attn-texts"}, root);
    var caption = el("p", {"class": "attn-caption"}, root);
    var scroller = el("div", {"class": "attn-scroll", tabindex: "0",
                              "aria-label": "Attention heatmap (scrolls sideways)"}, root);
    var readout = el("p", {"class": "attn-readout", "aria-live": "polite"}, root);
    root.appendChild(status);
    var measure = document.createElement("canvas").getContext("2d");
    var state = {};

    function matrix() {
      var s = data.sentences[+sentence.value], w = s.weights[kind.value][+layer.value];
      if (head.value !== "mean") return w[+head.value];
      return w[0].map(function (row, t) {
        return row.map(function (_, j) {
          var sum = 0;
          for (var k = 0; k < w.length; k++) sum += w[k][t][j];
          return Math.round(1000 * sum / w.length) / 1000;
        });
      });
    }

    function draw() {
      var s = data.sentences[+sentence.value], info = data.kinds[kind.value];
      var rows = s[info.rows], cols = s[info.columns], w = matrix();
      var font = getComputedStyle(root).fontFamily;
      measure.font = "12px " + font;
      var textW = function (list) {
        return Math.max.apply(null, list.map(function (p) { return measure.measureText(p).width; }));
      };
      var left = Math.ceil(textW(rows)) + 12;
      var top = Math.ceil(textW(cols) * Math.sin(Math.PI / 3)) + 16;
      var gridBottom = top + CELL * rows.length, legend = gridBottom + BARS + 16;
      var width = Math.max(left + CELL * cols.length + 12, left + 190), height = legend + 34;
      cols.forEach(function (p, j) {   // a slanted label reaches half its length to the right
        width = Math.max(width, Math.ceil(left + CELL * j + CELL / 2 + 8 + textW([p]) / 2));
      });
      var where = info.module.replace("L", layer.value);
      var what = single ? "the model's one attention (one layer, one head)" :
        (head.value === "mean" ? "mean of the " + data.heads + " heads" :
         "head " + (+head.value + 1)) + " of layer " + (+layer.value + 1);

      texts.innerHTML = "";
      [["German", s.source], ["Translation", s.translation], ["Reference", s.reference]]
        .forEach(function (p) {
          el("dt", {}, texts).textContent = p[0];
          el("dd", {lang: p[0] === "German" ? "de" : "en"}, texts).textContent = p[1];
        });
      caption.textContent = info.name.charAt(0).toUpperCase() + info.name.slice(1) + " (" + where +
        "), " + what + ". " + ROWS_TEXT[kind.value] + " Each row sums to 1. Hover over a row, " +
        "or focus its label with the Tab key, to see what it reads.";

      var svg = el("svg", {"class": "attn-map", width: width, height: height,
                           viewBox: "0 0 " + width + " " + height, role: "img",
                           "aria-label": info.name + ", " + what + ", sentence " + s.index + ": " +
                             rows.length + " rows by " + cols.length + " columns"}, null, true);
      var colLabels = cols.map(function (p, j) {
        var x = left + CELL * j + CELL / 2 + 4;
        return svgText(svg, {"class": "attn-col", "data-col": j,
                             transform: "translate(" + x + "," + (top - 6) + ") rotate(-60)"}, p);
      });
      var rowLabels = rows.map(function (p, t) {
        return svgText(svg, {"class": "attn-row", "data-row": t, x: left - 6,
                             y: top + CELL * t + CELL / 2 + 4, "text-anchor": "end",
                             tabindex: "0", role: "button", "aria-label": "row " + (t + 1) + ": " + p}, p);
      });
      var cells = el("g", {"class": "attn-cells"}, svg, true);
      w.forEach(function (row, t) {
        row.forEach(function (v, j) {
          if (kind.value === "dec" && j > t) return;   // the future: hidden by the causal mask
          var r = el("rect", {"class": "attn-cell", x: left + CELL * j, y: top + CELL * t,
                              width: CELL, height: CELL, fill: colour(v), "data-row": t,
                              "data-col": j, "data-w": fmt(v)}, cells, true);
          el("title", {}, r, true).textContent = rows[t] + " \u2192 " + cols[j] + ": " + fmt(v);
        });
      });
      var bars = cols.map(function (_, j) {
        return el("rect", {"class": "attn-bar", x: left + CELL * j + 3, y: gridBottom + 6,
                           width: CELL - 6, height: 0}, svg, true);
      });
      var grad = el("linearGradient", {id: "attn-viridis-" + me}, el("defs", {}, svg, true), true);
      VIRIDIS.forEach(function (c, i) {
        el("stop", {offset: i / (VIRIDIS.length - 1), "stop-color": c}, grad, true);
      });
      el("rect", {x: left, y: legend, width: 160, height: 10,
                  fill: "url(#attn-viridis-" + me + ")"}, svg, true);
      [0, 0.5, 1].forEach(function (v) {
        svgText(svg, {x: left + 160 * v, y: legend + 24, "text-anchor": "middle"}, String(v));
      });
      svgText(svg, {x: left - 6, y: legend + 9, "text-anchor": "end"}, "weight");
      var outline = el("rect", {"class": "attn-outline", x: left - 1, width: CELL * cols.length + 2,
                                height: CELL + 2, visibility: "hidden"}, svg, true);
      scroller.innerHTML = "";
      scroller.appendChild(svg);
      state = {rows: rows, cols: cols, w: w, colLabels: colLabels, rowLabels: rowLabels,
               bars: bars, outline: outline, top: top, gridBottom: gridBottom};
      root.setAttribute("data-view", [s.index, kind.value, layer.value, head.value].join("/"));
      highlight(null);

      function onRow(e) {
        var t = e.target.getAttribute("data-row");
        if (t !== null) highlight(+t);
      }
      svg.addEventListener("mouseover", onRow);
      svg.addEventListener("focusin", onRow);
      svg.addEventListener("mouseleave", function () { highlight(null); });
    }

    function highlight(t) {
      var st = state;
      st.rowLabels.forEach(function (r, i) { r.classList.toggle("active", i === t); });
      if (t === null) {
        st.outline.setAttribute("visibility", "hidden");
        st.colLabels.forEach(function (c) { c.classList.remove("reads"); c.removeAttribute("data-w"); });
        st.bars.forEach(function (b) { b.setAttribute("height", 0); });
        readout.textContent = "Hover over a row to see which " +
          (kind.value === "enc" ? "pieces" : kind.value === "dec" ? "earlier pieces" : "source pieces") +
          " it reads.";
        root.removeAttribute("data-row");
        return;
      }
      var row = st.w[t];
      st.outline.setAttribute("y", st.top + CELL * t - 1);
      st.outline.setAttribute("visibility", "visible");
      st.colLabels.forEach(function (c, j) {
        c.classList.toggle("reads", row[j] >= READS);
        c.setAttribute("data-w", fmt(row[j]));
      });
      st.bars.forEach(function (b, j) { b.setAttribute("height", Math.round(BARS * row[j] * 10) / 10); });
      // the keys it can see (in decoder self-attention, not the future), largest weight first
      var seen = row.map(function (v, j) { return j; }).filter(function (j) {
        return kind.value !== "dec" || j <= t;
      });
      var order = seen.sort(function (a, b) { return row[b] - row[a] || a - b; }).slice(0, 4);
      readout.textContent = "\u201c" + st.rows[t] + "\u201d reads " + order.map(function (j) {
        return "\u201c" + st.cols[j] + "\u201d " + fmt(row[j]);
      }).join(", ") + (seen.length > 4 ? ", \u2026" : "") + " (the bars under the map: its whole row).";
      root.setAttribute("data-row", t);
    }

    [sentence, kind, layer, head].forEach(function (s) { s.addEventListener("change", draw); });
    draw();
    status.textContent = "";
    root.setAttribute("data-ready", "true");
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll(".attn-explorer"), init);
  }
  window.attnbookExplorer = init;     // the translator page draws its maps with it (page.js)
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
