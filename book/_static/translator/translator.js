/* The book's translator, running in the reader's browser (book/translator.md): the cpu-base
   model of chapter 10, exported by `python -m attnbook.book.live export` as two ONNX graphs
   (model/encoder.onnx, model/decoder.onnx) and run by onnxruntime-web on one WebAssembly thread,
   with the book's tokenizer (tokenizer.js). Greedy and beam search follow
   attnbook.decoding.greedy_decode and beam_search step for step; every attention weight comes
   from the graphs, and a factor per head (1 on, 0 off) lets the reader switch heads off.
   Nothing is fetched from any other host. */
(function () {
  "use strict";

  // special ids, and the limits of attnbook.decoding (MAX_SOURCE_TOKENS; source length + 50)
  var PAD = 0, BOS = 2, EOS = 3, MAX_EXTRA = 50, MAX_SOURCE = 256;

  function Translator(base) {
    this.base = base;                       // the folder of manifest.json and the graphs
  }

  Translator.prototype.load = async function () {
    var get = async function (url, kind) {
      var r = await fetch(url);
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return kind === "json" ? r.json() : new Uint8Array(await r.arrayBuffer());
    };
    this.manifest = await get(this.base + "manifest.json", "json");
    this.tokenizer = new BookTokenizer(await get(this.base + "tokenizer.json", "json"));
    var opts = {executionProviders: ["wasm"], graphOptimizationLevel: "all"};
    this.encoder = await ort.InferenceSession.create(await get(this.base + "encoder.onnx"), opts);
    this.decoder = await ort.InferenceSession.create(await get(this.base + "decoder.onnx"), opts);
    var L = this.manifest.n_layers, h = this.manifest.h;
    this.L = L;
    this.h = h;
    this.heads = {enc: new Float32Array(L * h).fill(1), self: new Float32Array(L * h).fill(1),
                  cross: new Float32Array(L * h).fill(1)};
  };

  Translator.prototype.headTensor = function (kind) {
    return new ort.Tensor("float32", this.heads[kind], [this.L, this.h]);
  };

  // source ids -> {memory (1, S, d), mask (1, S), S, attention (1, L, h, S, S)}
  Translator.prototype.encode = async function (ids) {
    var S = ids.length;
    var src = new ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)), [1, S]);
    var mask = new ort.Tensor("bool", new Uint8Array(S).fill(1), [1, S]);
    var out = await this.encoder.run({src: src, src_mask: mask, enc_heads: this.headTensor("enc")});
    return {memory: out.memory, mask: mask, S: S, attention: out.enc_attention};
  };

  // the decoder on n prefixes of equal length t (rows of the same source): its outputs
  Translator.prototype.decode = async function (enc, prefixes) {
    var n = prefixes.length, t = prefixes[0].length, S = enc.S, d = enc.memory.dims[2];
    var ids = new BigInt64Array(n * t), memory = new Float32Array(n * S * d);
    for (var r = 0; r < n; r++) {
      for (var j = 0; j < t; j++) ids[r * t + j] = BigInt(prefixes[r][j]);
      memory.set(enc.memory.data, r * S * d);
    }
    return this.decoder.run({
      tgt: new ort.Tensor("int64", ids, [n, t]),
      memory: new ort.Tensor("float32", memory, [n, S, d]),
      src_mask: new ort.Tensor("bool", new Uint8Array(n * S).fill(1), [n, S]),
      self_heads: this.headTensor("self"), cross_heads: this.headTensor("cross")});
  };

  // log-softmax of the last position of each row, PAD and BOS never chosen (as the package)
  Translator.prototype.nextLogProbs = async function (enc, prefixes) {
    var out = await this.decode(enc, prefixes), logits = out.logits.data;
    var t = prefixes[0].length, V = out.logits.dims[2], rows = [];
    for (var r = 0; r < prefixes.length; r++) {
      var off = (r * t + t - 1) * V, row = new Float64Array(V), max = -Infinity, sum = 0;
      for (var v = 0; v < V; v++) {
        row[v] = (v === PAD || v === BOS) ? -Infinity : logits[off + v];
        if (row[v] > max) max = row[v];
      }
      for (v = 0; v < V; v++) sum += Math.exp(row[v] - max);
      var lse = max + Math.log(sum);
      for (v = 0; v < V; v++) row[v] -= lse;
      rows.push(row);
    }
    return rows;
  };

  function argmax(row) {
    var best = 0;
    for (var v = 1; v < row.length; v++) if (row[v] > row[best]) best = v;
    return best;
  }

  // attnbook.decoding.greedy_decode for one sentence: the ids after BOS, EOS not included
  Translator.prototype.greedy = async function (enc) {
    var ys = [BOS], limit = enc.S + MAX_EXTRA;
    for (var t = 1; t <= limit; t++) {
      var next = argmax((await this.nextLogProbs(enc, [ys]))[0]);
      ys.push(next);
      if (next === EOS) break;
    }
    var out = ys.slice(1), end = out.indexOf(EOS);
    return end < 0 ? out : out.slice(0, end);
  };

  function penalty(length, alpha) { return Math.pow((5 + length) / 6, alpha); }

  // the k best of a list of {score, ...} (ties: the earlier first, as a stable sort)
  function best(list, k) {
    return list.map(function (c, i) { return [c, i]; })
      .sort(function (a, b) { return (b[0].score - a[0].score) || (a[1] - b[1]); })
      .slice(0, k).map(function (p) { return p[0]; });
  }

  // attnbook.decoding.beam_search for one sentence (beam k, length penalty alpha)
  Translator.prototype.beam = async function (enc, k, alpha) {
    var limit = enc.S + MAX_EXTRA, maxPenalty = penalty(limit + 1, alpha);
    var alive = [{ids: [BOS], score: 0}], finished = [];
    for (var t = 1; t <= limit; t++) {
      var rows = await this.nextLogProbs(enc, alive.map(function (a) { return a.ids; }));
      var cands = [];                   // 1. every alive hypothesis extended by every token
      rows.forEach(function (row, i) {
        for (var v = 0; v < row.length; v++) {
          if (row[v] > -Infinity) cands.push({ids: alive[i].ids, tok: v, score: alive[i].score + row[v]});
        }
      });
      var top = best(cands, 2 * k);
      // 2. the k best that end in EOS join the finished set, scored with the length penalty
      top.slice(0, k).forEach(function (c) {
        if (c.tok === EOS) finished.push({ids: c.ids.slice(1), score: c.score / penalty(t, alpha)});
      });
      finished = best(finished, k);
      // 3. the k best that do not end in EOS stay alive
      alive = best(top.filter(function (c) { return c.tok !== EOS; }), k).map(function (c) {
        return {ids: c.ids.concat([c.tok]), score: c.score};
      });
      var bestFinished = finished.length ? finished[0].score : -Infinity;
      if (bestFinished >= alive[0].score / maxPenalty || t >= limit) {
        return finished.length ? finished[0].ids : alive[0].ids.slice(1);
      }
    }
    return alive[0].ids.slice(1);
  };

  // every attention weight for a source and its translation: one pass of each graph, the
  // decoder reading BOS and the translation (its rows predict the translation and EOS)
  Translator.prototype.attention = async function (enc, out) {
    var dec = await this.decode(enc, [[BOS].concat(out)]);
    return {enc: enc.attention, dec: dec.self_attention, cross: dec.cross_attention};
  };

  // log-probability of translation ``out`` (and its EOS) for the source, under the current heads
  Translator.prototype.logProb = async function (enc, out) {
    var dec = await this.decode(enc, [[BOS].concat(out)]), logits = dec.logits.data;
    var V = dec.logits.dims[2], target = out.concat([EOS]), total = 0;
    for (var t = 0; t < target.length; t++) {
      var off = t * V, max = -Infinity, sum = 0;
      for (var v = 0; v < V; v++) if (v !== PAD && v !== BOS && logits[off + v] > max) max = logits[off + v];
      for (v = 0; v < V; v++) if (v !== PAD && v !== BOS) sum += Math.exp(logits[off + v] - max);
      total += logits[off + target[t]] - max - Math.log(sum);
    }
    return total;
  };

  // text -> {ids, out, text, ms}: the whole translation of one sentence
  Translator.prototype.translate = async function (text, beamSize) {
    var ids = this.tokenizer.encode(text);
    if (!ids.length) throw new Error("Type a German sentence first: this one is empty.");
    if (ids.length > MAX_SOURCE) {
      throw new Error("This text is " + ids.length + " pieces long; the page translates at most " +
                      MAX_SOURCE + ". Split it into sentences.");
    }
    var start = performance.now(), enc = await this.encode(ids);
    var out = beamSize > 1 ? await this.beam(enc, beamSize, 0.6) : await this.greedy(enc);
    return {ids: ids, enc: enc, out: out, text: this.tokenizer.decode(out),
            ms: performance.now() - start};
  };

  window.AttnbookTranslator = Translator;
})();
