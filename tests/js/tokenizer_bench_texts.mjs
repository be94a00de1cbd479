// Writes the tokenizer benchmark texts (English prose, code, CJK), generated deterministically so every
// run measures the same bytes. Usage: node tokenizer_bench_texts.mjs OUTPUT_DIR [MEGABYTES]
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeRandom } from "./tokenizer_corpus.mjs";

const [outputDir, megabytesText = "2"] = process.argv.slice(2);
if (!outputDir) {
  console.error("usage: node tokenizer_bench_texts.mjs OUTPUT_DIR [MEGABYTES]");
  process.exit(2);
}
const targetBytes = Number(megabytesText) * 1e6;
const random = makeRandom(424242);
const pick = (list) => list[Math.floor(random() * list.length)];
// Zipf-like: early entries are much more frequent, as in real text.
const zipf = (list) => list[Math.floor(list.length * random() ** 2.5)];
const between = (low, high) => low + Math.floor(random() * (high - low + 1));

const englishWords = (
  "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by " +
  "not word but what some we can out other were all there when up use your how said an each she which do their " +
  "time if will way about many then them write would like so these her long make thing see him two has look more " +
  "day could go come did number sound no most people my over know water than call first who may down side been " +
  "now find any new work part take get place made live where after back little only round man year came show " +
  "every good me give our under name very through just form sentence great think say help low line differ turn " +
  "cause much mean before move right boy old too same tell does set three want air well also play small end put " +
  "home read hand port large spell add even land here must big high such follow act why ask men change went " +
  "light kind off need house picture try us again animal point mother world near build self earth father head " +
  "stand own page should country found answer school grow study still learn plant cover food sun four between " +
  "state keep eye never last let thought city tree cross farm hard start might story saw far sea draw left late " +
  "run don't while press close night real life few north open seem together next white children begin got walk " +
  "example ease paper group always music those both mark often letter until mile river car feet care second book " +
  "carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face " +
  "wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family " +
  "direct pose leave song measure door product black short numeral class wind question happen complete ship area " +
  "half rock order fire south problem piece told knew pass since top whole king space heard best hour better " +
  "during hundred five remember step early hold west ground interest reach fast verb sing listen six table travel " +
  "less morning ten simple several vowel toward war lay against pattern slow center love person money serve " +
  "appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark " +
  "machine note wait plan figure star box noun field rest correct able pound done beauty drive stood contain " +
  "front teach week final gave green oh quick develop ocean warm free minute strong special mind behind clear " +
  "tail produce fact street inch multiply nothing course stay wheel full force blue object decide surface deep " +
  "moon island foot system busy test record boat common gold possible plane stead dry wonder laugh thousand ago " +
  "ran check game shape equate hot miss brought heat snow tire bring yes distant fill east paint language among"
).split(" ");
const names = ["Alice", "Bob", "London", "Paris", "Monday", "October", "Google", "Python", "Europe", "Smith"];

function english() {
  let text = "";
  while (text.length < targetBytes) {
    const sentences = between(3, 8);
    for (let s = 0; s < sentences; s++) {
      const length = between(6, 24);
      const words = [];
      for (let w = 0; w < length; w++) {
        const roll = random();
        let word = roll < 0.04 ? pick(names) : roll < 0.06 ? String(between(1, 2025)) : zipf(englishWords);
        if (w > 0 && w < length - 1 && random() < 0.07) word += ",";
        words.push(word);
      }
      words[0] = words[0][0].toUpperCase() + words[0].slice(1);
      const sentence = words.join(" ") + pick([".", ".", ".", "?", "!", ";"]);
      text += (random() < 0.05 ? `"${sentence}"` : sentence) + " ";
    }
    text = text.trimEnd() + "\n\n";
  }
  return text;
}

function code() {
  const parts = ["get", "set", "user", "value", "count", "index", "buffer", "node", "list", "map", "config", "token",
    "request", "result", "item", "size", "data", "key", "error", "handler", "cache", "path", "file", "line"];
  const identifier = () => {
    const n = between(1, 3), words = Array.from({ length: n }, () => pick(parts));
    return random() < 0.5 ? words.join("_") : words[0] + words.slice(1).map((w) => w[0].toUpperCase() + w.slice(1)).join("");
  };
  const expression = () => pick([
    () => `${identifier()} + ${between(0, 100)}`, () => `${identifier()}(${identifier()}, ${identifier()})`,
    () => `${identifier()}[${identifier()}]`, () => `"${identifier()}: %d\\n"`, () => `${identifier()} * 2 - 1`,
    () => `${identifier()}.${identifier()}()`, () => `${identifier()} == nullptr`, () => `0x${between(0, 65535).toString(16)}`,
  ])();
  let text = "";
  while (text.length < targetBytes) {
    if (random() < 0.5) {
      text += `// ${zipf(englishWords)} ${zipf(englishWords)} ${identifier()} before ${zipf(englishWords)}\n`;
      text += `static int ${identifier()}(const std::vector<int>& ${identifier()}, int ${identifier()}) {\n`;
      for (let i = between(2, 10); i > 0; i--) {
        text += pick([
          () => `  int ${identifier()} = ${expression()};\n`,
          () => `  if (${identifier()} < ${between(0, 64)}) {\n    return ${expression()};\n  }\n`,
          () => `  for (size_t i = 0; i < ${identifier()}.size(); ++i) ${identifier()} += ${identifier()}[i];\n`,
          () => `  ${identifier()}->${identifier()} = ${expression()};  // ${zipf(englishWords)}\n`,
        ])();
      }
      text += `  return ${expression()};\n}\n\n`;
    } else {
      text += `def ${identifier()}(${identifier()}, ${identifier()}=None):\n    """${zipf(englishWords)} ${zipf(englishWords)}."""\n`;
      for (let i = between(2, 8); i > 0; i--) {
        text += pick([
          () => `    ${identifier()} = ${expression()}\n`,
          () => `    if ${identifier()} is None:\n        raise ValueError(f"bad {${identifier()}!r}")\n`,
          () => `    for ${identifier()} in range(${between(1, 100)}):\n        ${identifier()}.append(${expression()})\n`,
          () => `    return {"${identifier()}": ${expression()}, "${identifier()}": [${between(0, 9)}, ${between(10, 99)}]}\n`,
        ])();
      }
      text += "\n\n";
    }
  }
  return text;
}

function cjk() {
  const hanzi = Array.from(
    "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都" +
    "三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知使情明性全相开理体实现加量高长部问本给意新力手电她战正合等");
  const kana = Array.from("あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞ");
  const katakana = Array.from("アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモラリルレロンコンピュータ");
  let text = "";
  while (text.length * 3 < targetBytes) {
    const japanese = random() < 0.3;
    let sentence = "";
    for (let i = between(8, 40); i > 0; i--) {
      const roll = random();
      sentence += japanese && roll < 0.45 ? zipf(kana) : japanese && roll < 0.55 ? zipf(katakana) : zipf(hanzi);
      if (i > 3 && random() < 0.08) sentence += japanese ? "、" : "，";
    }
    text += sentence + pick(["。", "。", "！", "？"]) + (random() < 0.1 ? "\n" : "");
  }
  return text;
}

mkdirSync(outputDir, { recursive: true });
for (const [name, make] of [["english", english], ["code", code], ["cjk", cjk]]) {
  const text = make();
  writeFileSync(join(outputDir, `${name}.txt`), text);
  console.log(`${name}.txt: ${Buffer.byteLength(text)} bytes`);
}
