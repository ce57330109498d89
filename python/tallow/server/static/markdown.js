// Markdown to DOM nodes, for model output. Every piece of text goes in as a text node or through
// textContent, never as HTML: nothing the model writes can become markup or script.
//
// What it reads: fenced code blocks (an unclosed fence, as while an answer streams, runs to the
// end), headings, bullet and numbered lists, block quotes, paragraphs with line breaks, and
// inline code, bold, italics and http(s) links (any other link stays text).

const FENCE = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const INLINE = new RegExp(
  [
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source, // code: 1, 2
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source, // bold: 3
    /(?<![\w*])\*(?=\S)([^*]*?\S)\*(?![\w*])/.source, // italics: 4
    /(?<![\w_])_(?=\S)([^_]*?\S)_(?![\w_])/.source, // italics: 5
    /\[([^\]\n]+)\]\(([^()\s]+)\)/.source, // link: 6, 7
  ].join("|"),
  "g",
);

/** Replaces the children of `container` with `text` rendered as markdown. */
export function renderMarkdown(text, container) {
  container.replaceChildren(...blocks(text.split("\n")));
}

function el(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

function startsBlock(line) {
  return [FENCE, HEADING, BULLET, NUMBERED, QUOTE].some((pattern) => pattern.test(line));
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const close = m[1];
      const body = [];
      for (i++; i < lines.length && lines[i].trim() !== close; i++) body.push(lines[i]);
      i++; // the closing fence, or past the end
      const pre = el("pre");
      const code = el("code", body.join("\n"));
      if (m[2]) code.className = `language-${m[2]}`;
      pre.append(code);
      out.push(pre);
    } else if ((m = HEADING.exec(line))) {
      // Headings start at h3: an answer's title should not outshout the page.
      const heading = el(`h${Math.min(m[1].length + 2, 6)}`);
      heading.append(...inline(m[2]));
      out.push(heading);
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const pattern = BULLET.test(line) ? BULLET : NUMBERED;
      const list = el(pattern === BULLET ? "ul" : "ol");
      if (pattern === NUMBERED) list.start = Number(NUMBERED.exec(line)[1]);
      for (; i < lines.length && pattern.test(lines[i]); i++) {
        const item = pattern.exec(lines[i]);
        const li = el("li");
        li.append(...inline(item[item.length - 1]));
        list.append(li);
      }
      out.push(list);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) quoted.push(QUOTE.exec(lines[i])[1]);
      const quote = el("blockquote");
      quote.append(...blocks(quoted));
      out.push(quote);
    } else if (line.trim() === "") {
      i++;
    } else {
      const paragraph = el("p");
      let first = true;
      for (; i < lines.length && lines[i].trim() !== "" && (first || !startsBlock(lines[i])); i++) {
        if (!first) paragraph.append(el("br"));
        paragraph.append(...inline(lines[i]));
        first = false;
      }
      out.push(paragraph);
    }
  }
  return out;
}

function inline(text) {
  const nodes = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) nodes.push(document.createTextNode(text.slice(last, m.index)));
    if (m[1] !== undefined) {
      nodes.push(el("code", m[2]));
    } else if (m[3] !== undefined || m[4] !== undefined || m[5] !== undefined) {
      const node = el(m[3] !== undefined ? "strong" : "em");
      node.append(...inline(m[3] ?? m[4] ?? m[5]));
      nodes.push(node);
    } else {
      nodes.push(link(m[6], m[7], m[0]));
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

function link(label, href, source) {
  let url = null;
  try {
    url = new URL(href);
  } catch {
    // not an absolute URL: text
  }
  if (url === null || (url.protocol !== "http:" && url.protocol !== "https:")) {
    return document.createTextNode(source);
  }
  const a = el("a", label);
  a.href = url.href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}
