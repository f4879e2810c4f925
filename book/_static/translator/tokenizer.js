// The book's sentencepiece BPE tokenizer in the browser (attnbook.tokenizer; the translator
// page). It reads the pieces and scores that `python -m attnbook.book.live export` writes
// (tokenizer.json) and encodes as sentencepiece does with the book's settings: NFKC, spaces
// squeezed and marked with "▁" (a "▁" before the first word too), then the pair of adjacent
// symbols whose merge is the best-scored piece is merged, again and again. Characters the
// vocabulary lacks become <unk> (id 1), one for each run of them. tests/test_live.py checks it
// against sentencepiece on 2,000 sentences and some made to be hard.
"use strict";

class BookTokenizer {
  constructor(vocab) {            // vocab: {pieces: [[piece, score, type], ...], unk_id}
    this.pieces = vocab.pieces.map((p) => p[0]);
    this.ids = new Map();
    this.scores = new Map();
    vocab.pieces.forEach(([piece, score, type], id) => {
      if (type === 1) {           // a normal piece; control pieces (<s>, </s>, <pad>) never match
        this.ids.set(piece, id);
        this.scores.set(piece, score);
      }
    });
    this.unk = vocab.unk_id;
  }

  normalize(text) {
    const squeezed = text.normalize("NFKC").replace(/\s+/gu, " ").trim();
    return squeezed ? "▁" + squeezed.replace(/ /g, "▁") : "";
  }

  // text -> pieces (strings): the symbols left when no adjacent pair merges into a piece
  pieceStrings(text) {
    const symbols = Array.from(this.normalize(text));     // code points, not UTF-16 halves
    for (;;) {
      let best = -1, bestScore = -Infinity;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const score = this.scores.get(symbols[i] + symbols[i + 1]);
        if (score !== undefined && score > bestScore) {
          best = i;
          bestScore = score;
        }
      }
      if (best < 0) return symbols;
      symbols.splice(best, 2, symbols[best] + symbols[best + 1]);
    }
  }

  encode(text) {                 // a run of characters the vocabulary lacks is one <unk>
    const ids = [];
    for (const p of this.pieceStrings(text)) {
      const id = this.ids.has(p) ? this.ids.get(p) : this.unk;
      if (!(id === this.unk && ids[ids.length - 1] === this.unk)) ids.push(id);
    }
    return ids;
  }

  decode(ids) {                  // as sentencepiece: <unk> shows as " ⁇ ", control ids vanish,
    let text = "";               // the first "▁" goes and the others become spaces
    for (const id of ids) {
      if (id === 3) break;       // EOS: the translation ends
      if (id === this.unk) text += " \u2047 ";
      else if (this.ids.has(this.pieces[id]) && this.ids.get(this.pieces[id]) === id) text += this.pieces[id];
    }
    return text.replace(/^▁/, "").replace(/▁/g, " ");
  }
}

if (typeof module !== "undefined") module.exports = { BookTokenizer };
