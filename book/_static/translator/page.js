/* The translator page (book/translator.md): a form for a German sentence, its translation and
   time, every attention map of that translation (drawn by the explorer's own code,
   explorer.js), and a switch for every head. Everything the reader types is shown as text,
   never as markup. */
(function () {
  "use strict";

  var KINDS = [["enc", "Encoder self-attention"], ["self", "Decoder self-attention"],
               ["cross", "Cross-attention"]];
  var EXPLORER_KIND = {enc: "enc", self: "dec", cross: "cross"};   // explorer.js and head_ablation

  function el(name, attrs, parent, text) {
    var e = document.createElement(name);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  // (1, L, h, R, C) tensor -> [L][h][R][C] arrays rounded to 3 decimals, as the explorer's data
  function nested(tensor) {
    var d = tensor.dims, out = [], data = tensor.data;
    for (var l = 0; l < d[1]; l++) {
      var heads = [];
      for (var h = 0; h < d[2]; h++) {
        var rows = [];
        for (var r = 0; r < d[3]; r++) {
          var row = [], off = ((l * d[2] + h) * d[3] + r) * d[4];
          for (var c = 0; c < d[4]; c++) row.push(Math.round(1000 * data[off + c]) / 1000);
          rows.push(row);
        }
        heads.push(rows);
      }
      out.push(heads);
    }
    return out;
  }

  function init(root) {
    var base = root.getAttribute("data-base");
    var status = el("p", {"class": "tr-status", "aria-live": "polite"}, root,
                    "Loading the model and the runtime (about 10 MB on a first visit)\u2026");
    if (typeof WebAssembly !== "object" || typeof BigInt64Array === "undefined") {
      status.textContent = "This browser cannot run the translator: it needs WebAssembly and " +
        "64-bit integer arrays (any browser since 2021 has both). The rest of the book works without them.";
      root.setAttribute("data-state", "failed");
      return;
    }
    var translator = new window.AttnbookTranslator(base), extras = {};
    var form = el("form", {"class": "tr-form"}, root);
    el("label", {"for": "tr-source"}, form, "German sentence");
    // no maxlength: a pasted paragraph is never cut silently; the translator says how many
    // pieces it has and how many it takes
    var source = el("textarea", {id: "tr-source", rows: "2", lang: "de", spellcheck: "false"}, form);
    var row = el("div", {"class": "tr-row"}, form);
    var examplesLabel = el("label", {}, row, "Or pick a test sentence ");
    var examples = el("select", {"aria-label": "test sentence"}, examplesLabel);
    var decoding = el("select", {"aria-label": "decoding"}, el("label", {}, row, "Decoding "));
    [["1", "greedy"], ["4", "beam search, 4 beams"]].forEach(function (o) {
      el("option", {value: o[0]}, decoding, o[1]);
    });
    var go = el("button", {type: "submit", disabled: "disabled"}, row, "Translate");
    var result = el("dl", {"class": "tr-result", "aria-live": "polite"}, root);
    var panel = el("fieldset", {"class": "tr-heads", disabled: "disabled"}, root);
    el("legend", {}, panel, "Switch heads off (checked: on)");
    var table = el("table", {}, panel), switches = {}, rowSwitches = [], rowOf = {};
    var head = el("tr", {}, el("thead", {}, table));
    el("th", {scope: "col"}, head, "layer");
    for (var h = 0; h < 4; h++) el("th", {scope: "col"}, head, "head " + (h + 1));
    el("th", {scope: "col"}, head, "all");
    var body = el("tbody", {}, table);
    var reset = el("button", {type: "button"}, panel, "All heads on");
    var effect = el("div", {"class": "tr-effect", "aria-live": "polite"}, panel);
    var maps = el("div", {"class": "tr-maps"}, root);
    var last = null;

    function show(list) {
      result.innerHTML = "";
      list.forEach(function (p) {
        el("dt", {}, result, p[0]);
        el("dd", p[2] ? {lang: p[2]} : {}, result, p[1]);
      });
    }

    function reference(text) {
      var match = (extras.examples || []).filter(function (e) { return e.source === text; })[0];
      return match ? match.reference : "(none: your own sentence)";
    }

    // for screen readers and for reading: each English piece and the German pieces it reads
    // most in the last layer's cross-attention (mean of the heads)
    function topTable(t, att) {
      var tok = translator.tokenizer, d = att.cross.dims, data = att.cross.data, L = d[1] - 1;
      var details = el("details", {"class": "tr-top"}, maps);
      el("summary", {}, details, "The last layer's cross-attention as a table");
      var table = el("table", {}, details), head = el("tr", {}, el("thead", {}, table));
      ["English piece", "reads most (mean of the heads)"].forEach(function (c) {
        el("th", {scope: "col"}, head, c);
      });
      var body = el("tbody", {}, table), next = t.out.concat([3]);
      for (var r = 0; r < d[3]; r++) {
        var w = [];
        for (var c = 0; c < d[4]; c++) {
          var sum = 0;
          for (var h = 0; h < d[2]; h++) sum += data[((L * d[2] + h) * d[3] + r) * d[4] + c];
          w.push([sum / d[2], c]);
        }
        w.sort(function (a, b) { return b[0] - a[0] || a[1] - b[1]; });
        var tr = el("tr", {}, body);
        el("th", {scope: "row"}, tr, next[r] === 3 ? "</s>" : tok.pieces[next[r]]);
        el("td", {}, tr, w.slice(0, 3).map(function (p) {
          return tok.pieces[t.ids[p[1]]] + " " + p[0].toFixed(2);
        }).join(", "));
      }
    }

    function drawMaps(text, t, att) {
      var tok = translator.tokenizer, piece = function (i) { return tok.pieces[i]; };
      var src = t.ids.map(piece), tgt = ["<s>"].concat(t.out.map(piece));
      window.ATTNBOOK_LIVE = {
        layers: translator.L, heads: translator.h,
        kinds: {enc: {name: "encoder self-attention", module: "encoder.L.self_attn", rows: "src", columns: "src"},
                dec: {name: "decoder self-attention", module: "decoder.L.self_attn", rows: "tgt", columns: "tgt"},
                cross: {name: "cross-attention", module: "decoder.L.cross_attn", rows: "next", columns: "src"}},
        sentences: [{index: "yours", source: text, translation: t.text, reference: reference(text),
                     src: src, tgt: tgt, next: t.out.map(piece).concat(["</s>"]),
                     weights: {enc: nested(att.enc), dec: nested(att.dec), cross: nested(att.cross)}}]};
      maps.innerHTML = "";
      var div = el("div", {"class": "attn-explorer", "data-source": "ATTNBOOK_LIVE"}, maps);
      window.attnbookExplorer(div);
      topTable(t, att);
    }

    async function run(event) {
      if (event) event.preventDefault();
      go.disabled = true;
      panel.disabled = true;
      try {
        translator.heads.enc.fill(1);
        translator.heads.self.fill(1);
        translator.heads.cross.fill(1);
        Object.keys(switches).forEach(function (k) { switches[k].checked = true; });
        rowSwitches.forEach(function (b) { b.checked = true; b.indeterminate = false; });
        effect.textContent = "";
        var text = source.value, t = await translator.translate(text, +decoding.value);
        var att = await translator.attention(t.enc, t.out);
        last = {text: text, t: t, logp: await translator.logProb(t.enc, t.out)};
        // the German sentence and its translation are shown once, above the maps (explorer.js)
        show([["Time", (t.ms / 1000).toFixed(2) + " s (" + decoding.options[decoding.selectedIndex].text +
                       ", " + t.out.length + " pieces)"]]);
        drawMaps(text, t, att);
        root.setAttribute("data-translation", t.text);
      } catch (err) {
        show([["Error", err.message]]);
        root.setAttribute("data-translation", "");
      }
      go.disabled = false;
      panel.disabled = false;
    }

    // a row's "all" box: ticked when all its heads are on, half-ticked when some are
    function syncRow(kind, layer) {
      var on = 0;
      for (var h = 0; h < 4; h++) on += switches[kind + layer + "." + h].checked ? 1 : 0;
      rowOf[kind + layer].checked = on === 4;
      rowOf[kind + layer].indeterminate = on > 0 && on < 4;
    }

    async function switched() {
      if (!last) return;
      panel.disabled = true;
      var off = [];
      KINDS.forEach(function (k) {
        for (var l = 0; l < translator.L; l++) {
          for (var h = 0; h < translator.h; h++) {
            var on = switches[k[0] + l + "." + h].checked;
            translator.heads[k[0]][l * translator.h + h] = on ? 1 : 0;
            if (!on) off.push([k[0], l, h]);
          }
        }
      });
      var enc = await translator.encode(last.t.ids);
      var out = +decoding.value > 1 ? await translator.beam(enc, +decoding.value, 0.6) : await translator.greedy(enc);
      var logp = await translator.logProb(enc, last.t.out);
      effect.innerHTML = "";
      el("p", {}, effect, off.length + " head(s) off. Translation now: ");
      el("p", {"class": "tr-now", lang: "en"}, effect, translator.tokenizer.decode(out));
      el("p", {}, effect, "Log-probability of the original translation: " + last.logp.toFixed(2) +
         " with every head, " + logp.toFixed(2) + " now (" + (logp - last.logp >= 0 ? "+" : "") +
         (logp - last.logp).toFixed(2) + " nats).");
      if (off.length === 1 && extras.ablation) {
        var k = off[0], rec = extras.ablation.per_head.filter(function (r) {
          return r.kind === EXPLORER_KIND[k[0]] && r.layer === k[1] + 1 && r.head === k[2] + 1;
        })[0];
        if (rec) {
          el("p", {}, effect, "The book's head ablation of this head (chapter 11's model, on the " +
             "validation set): validation loss " + (rec.delta_loss >= 0 ? "+" : "") +
             rec.delta_loss.toFixed(3) + " nats per token, greedy BLEU " + (rec.delta_bleu >= 0 ? "+" : "") +
             rec.delta_bleu.toFixed(2) + ".");
        }
      }
      root.setAttribute("data-ablated", translator.tokenizer.decode(out));
      panel.disabled = false;
    }

    KINDS.forEach(function (k) {
      for (var l = 0; l < 3; l++) {
        var tr = el("tr", {}, body);
        el("th", {scope: "row"}, tr, k[1] + ", layer " + (l + 1));
        for (var h = 0; h < 4; h++) {
          var box = el("input", {type: "checkbox", checked: "checked",
                                 "aria-label": k[1] + ", layer " + (l + 1) + ", head " + (h + 1),
                                 "data-head": k[0] + "/" + (l + 1) + "/" + (h + 1)}, el("td", {}, tr));
          switches[k[0] + l + "." + h] = box;
          box.addEventListener("change", (function (kind, layer) {
            return function () { syncRow(kind, layer); switched(); };
          })(k[0], l));
        }
        var all = el("input", {type: "checkbox", checked: "checked",
                               "aria-label": k[1] + ", layer " + (l + 1) + ", all heads",
                               "data-layer": k[0] + "/" + (l + 1)}, el("td", {}, tr));
        all.addEventListener("change", (function (kind, layer, box) {
          return function () {
            for (var h = 0; h < 4; h++) switches[kind + layer + "." + h].checked = box.checked;
            box.indeterminate = false;
            switched();
          };
        })(k[0], l, all));
        rowSwitches.push(all);
        rowOf[k[0] + l] = all;
      }
    });
    reset.addEventListener("click", function () {
      Object.keys(switches).forEach(function (k) { switches[k].checked = true; });
      rowSwitches.forEach(function (b) { b.checked = true; b.indeterminate = false; });
      switched();
    });
    form.addEventListener("submit", run);
    examples.addEventListener("change", function () {
      if (examples.value) source.value = examples.value;
    });
    // a sentence of the reader's own: the menu no longer names a test sentence
    source.addEventListener("input", function () {
      if (examples.value && source.value !== examples.value) examples.value = "";
    });

    var start = performance.now();
    Promise.all([translator.load(),
                 fetch(base + "extras.json").then(function (r) { return r.ok ? r.json() : {}; })])
      .then(function (loaded) {
        extras = loaded[1] || {};
        el("option", {value: ""}, examples, "\u2014");
        (extras.examples || []).forEach(function (e) {
          el("option", {value: e.source}, examples, "no. " + e.index + ": " + e.source.slice(0, 50));
        });
        if (extras.examples && extras.examples.length) {
          examples.value = source.value = extras.examples[0].source;
        }
        status.textContent = "Ready: the model and the runtime loaded in " +
          ((performance.now() - start) / 1000).toFixed(1) + " s. Type a sentence and press Translate.";
        go.disabled = false;
        root.setAttribute("data-state", "ready");
      })
      .catch(function (err) {
        status.textContent = "The translator could not load (" + err.message + "). It needs a " +
          "browser with WebAssembly and the book's files served over http(s).";
        root.setAttribute("data-state", "failed");
      });
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll(".attn-translator"), init);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
