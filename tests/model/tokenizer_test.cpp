// Tokenizer tests: exact token ids against llama.cpp on fixed strings for both real models,
// decode(encode(s)) == s on varied text, special tokens, and small synthetic vocabularies (built as
// in-memory GGUF images) for the merge rules and the validation of malformed vocabularies.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_internal.hpp"
#include "support/models.hpp"

namespace gaac::model {
namespace {

// ---- Reference token ids ----------------------------------------------------------------------
//
// Produced by llama.cpp's own tokenizer through llama-cpp-python 0.3.36 (PyPI; it builds the
// llama.cpp sources it vendors), in a throwaway virtual environment:
//   python3 -m venv /tmp/venv && /tmp/venv/bin/pip install llama-cpp-python==0.3.36
//   llm = llama_cpp.Llama(model_path=GGUF, vocab_only=True)
//   ids = llm.tokenize(text.encode(), add_bos=False, special=parse_special)
// on the GGUF files of tests/support/models.hpp (SmolLM2-135M-Instruct.Q4_1.gguf,
// gemma-3-270m-q4_k_m.gguf). The same comparison on ~7,000 further strings (random mixes of
// scripts, digits, contractions, whitespace and special-token texts, slices of license texts, C
// headers and Python sources) found no difference, except the one documented in the
// Gemma3Tokenizer.ParseSpecialFalseKnownDifference test. As a cross-check of llama.cpp itself, the
// fixed strings and those ~7,000 also gave the same ids in two other implementations, with the
// vocabularies taken from the same GGUF files: Hugging Face tokenizers 0.23.3 (BPE with merges,
// pre-tokenizers Digits(individual_digits) + ByteLevel, as SmolLM2's tokenizer.json) and
// sentencepiece 0.2.3 (a BPE ModelProto of Gemma's pieces, scores and types, byte fallback,
// no dummy prefix; strings holding U+2581 or "<unusedN>" left out of that comparison).
struct TokenCase {
  std::string_view text;
  bool parse_special;
  std::vector<Token> ids;
};

const TokenCase kSmolLM2Cases[] = {
    {"Hello world",
     true,
     {
         19556, 905,
     }},
    {" Hello  world ",
     true,
     {
         38699, 216, 905, 216,
     }},
    {"   three leading spaces and three trailing   ",
     true,
     {
         256, 1296, 2899, 5600, 284, 1296, 35079, 333,
     }},
    {"Line one\nLine two\n\nLine four\r\n\tindented\n",
     true,
     {
         11907, 582, 198, 11907, 827, 198, 198, 11907, 1876, 2738, 197, 526, 6574, 198,
     }},
    {"12345 67890 3.14159 1,000,000 2024-06-01 0x1F",
     true,
     {
         33, 34, 35, 36, 37, 216, 38, 39, 40, 41, 32, 216, 35, 30, 33, 36, 33, 37, 41, 216, 33, 28, 32, 32, 32,
         28, 32, 32, 32, 216, 34, 32, 34, 36, 29, 32, 38, 29, 32, 33, 216, 32, 104, 33, 54,
     }},
    {"don't I'll we're they've she'd it's I'm DON'T You'Ll",
     true,
     {
         12420, 982, 339, 3060, 392, 2316, 502, 3543, 1041, 6737, 357, 506, 339, 5248, 422, 2154, 23, 68, 1206,
         23, 60, 92,
     }},
    {"Wow!!! What?!... (ok) [x] {y} <z> --- *** ~~~ @#$%^&",
     true,
     {
         32373, 29646, 1812, 17593, 2026, 365, 2231, 25, 933, 104, 77, 1662, 105, 109, 2067, 106, 46, 21749,
         33117, 216, 9493, 110, 3394, 19, 20, 21, 78, 22,
     }},
    {"def add(a, b):\n\treturn a + b  # sum\n\n\tif (x && y) { z++; }\n    ",
     true,
     {
         1604, 803, 24, 81, 28, 278, 727, 198, 197, 5406, 253, 1232, 278, 216, 907, 2028, 1116, 197, 342, 365,
         104, 1456, 22, 329, 25, 1662, 1892, 11444, 43, 4029, 2367,
     }},
    {"Café naïve résumé déjà vu — Ελληνικά κείμενο, Русский текст, 日本語のテキストと漢字, 中文简体字, 한국어 문장입니다"
     ". Emoji: 😀👍🏽👨\u200d👩\u200d👧 🇫🇷! Arabic: مرحبا بالعالم. Hebrew: שלום עולם. Combining: e"
     "\u0301 a\u0308 n\u0303o. Math: ∑ x² ≤ ∞, ½ ¾ Ⅻ. Thai: สว\u0e31สด\u0e35คร\u0e31บ. Hindi: नम"
     "स\u094dत\u0947 द\u0941निया. Zero\u200bwidth, NBSP\u00a0here, ideographic\u3000space, ‘quot"
     "es’ “double” «guillemets».",
     true,
     {
         51, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 32564, 90, 16739, 386, 101, 1841, 5664, 239,
         17162, 17162, 25723, 11517, 12001, 21118, 26112, 31953, 14240, 22442, 16674, 14240, 11517, 10589, 28,
         5470, 250, 14714, 9382, 39511, 7872, 24958, 38106, 6643, 13760, 24674, 28, 17097, 241, 115, 40993,
         179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 7365, 118, 177, 137, 112, 36518,
         28, 216, 28589, 29184, 40236, 218, 18645, 237, 36518, 28, 216, 33085, 246, 181, 130, 251, 183, 240,
         129, 25947, 122, 133, 183, 248, 115, 183, 248, 223, 41259, 226, 41259, 114, 30, 2553, 33777, 42,
         40303, 218, 10813, 235, 231, 10813, 233, 138, 10813, 235, 118, 321, 231, 10813, 235, 119, 321, 231,
         10813, 235, 117, 15107, 225, 121, 10813, 225, 132, 17, 12428, 42, 36395, 20602, 44626, 31462, 10805,
         45726, 22208, 34966, 22208, 21706, 30, 9355, 42, 12960, 119, 31838, 23970, 162, 247, 12960, 112,
         23970, 31838, 162, 247, 30, 29845, 42, 297, 151, 219, 253, 151, 226, 304, 151, 221, 95, 30, 8948, 42,
         19995, 235, 1792, 19133, 38599, 19995, 248, 28, 216, 16738, 216, 43124, 216, 173, 223, 121, 30, 22839,
         42, 216, 10283, 120, 10283, 117, 10283, 126, 10283, 120, 10283, 238, 10283, 130, 10283, 222, 44701,
         10283, 126, 10283, 244, 30, 28910, 42, 12335, 118, 35090, 38770, 16525, 26293, 30581, 12335, 116,
         42990, 30658, 27011, 32932, 18075, 30, 22160, 321, 229, 6930, 28, 442, 50, 7149, 15442, 1531, 28,
         1290, 4551, 12109, 218, 11602, 28, 1551, 385, 2346, 417, 619, 21414, 573, 23708, 6058, 3285, 93, 1175,
         20306, 30,
     }},
    {"<|im_start|>user\nHi<|im_end|>\n",
     true,
     {
         1, 4093, 198, 26843, 2, 198,
     }},
    {"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
     true,
     {
         1, 9690, 198, 2683, 359, 5356, 30, 2, 198, 1, 520, 9531, 198,
     }},
    {"<|endoftext|><filename>a.py\n<start_of_turn>user",
     true,
     {
         0, 6, 81, 30, 1306, 198, 44, 3738, 79, 1714, 79, 20589, 46, 4093,
     }},
    {"<|im_start|>user\nHi<|im_end|>\n",
     false,
     {
         44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46, 198,
     }},
};

const TokenCase kGemma3Cases[] = {
    {"Hello world",
     true,
     {
         9259, 1902,
     }},
    {" Hello  world ",
     true,
     {
         26352, 138, 12392, 236743,
     }},
    {"   three leading spaces and three trailing   ",
     true,
     {
         139, 19891, 5830, 9952, 532, 1806, 45330, 139,
     }},
    {"Line one\nLine two\n\nLine four\r\n\tindented\n",
     true,
     {
         4539, 886, 107, 4539, 1156, 108, 4539, 2390, 251, 107, 255968, 724, 16764, 107,
     }},
    {"12345 67890 3.14159 1,000,000 2024-06-01 0x1F",
     true,
     {
         236770, 236778, 236800, 236812, 236810, 236743, 236825, 236832, 236828, 236819, 236771, 236743,
         236800, 236761, 236770, 236812, 236770, 236810, 236819, 236743, 236770, 236764, 236771, 236771,
         236771, 236764, 236771, 236771, 236771, 236743, 236778, 236771, 236778, 236812, 236772, 236771,
         236825, 236772, 236771, 236770, 236743, 236771, 236781, 236770, 236811,
     }},
    {"don't I'll we're they've she'd it's I'm DON'T You'Ll",
     true,
     {
         13246, 236789, 236745, 564, 236789, 859, 692, 236789, 500, 901, 236789, 560, 1304, 236789, 236753,
         625, 236789, 236751, 564, 236789, 236757, 52402, 236789, 236774, 1599, 236789, 148194,
     }},
    {"Wow!!! What?!... (ok) [x] {y} <z> --- *** ~~~ @#$%^&",
     true,
     {
         48819, 11145, 2900, 26052, 1390, 568, 680, 236768, 870, 236781, 236842, 642, 236762, 236783, 655,
         236802, 236813, 9190, 27435, 2578, 18171, 1392, 190494, 236884, 236880,
     }},
    {"def add(a, b):\n\treturn a + b  # sum\n\n\tif (x && y) { z++; }\n    ",
     true,
     {
         2063, 1138, 236769, 236746, 236764, 518, 1473, 107, 255968, 2060, 496, 900, 518, 138, 236865, 2324,
         108, 255968, 584, 568, 236781, 2732, 570, 236768, 642, 904, 7567, 682, 107, 140,
     }},
    {"Café naïve résumé déjà vu — Ελληνικά κείμενο, Русский текст, 日本語のテキストと漢字, 中文简体字, 한국어 문장입니다"
     ". Emoji: 😀👍🏽👨\u200d👩\u200d👧 🇫🇷! Arabic: مرحبا بالعالم. Hebrew: שלום עולם. Combining: e"
     "\u0301 a\u0308 n\u0303o. Math: ∑ x² ≤ ∞, ½ ¾ Ⅻ. Thai: สว\u0e31สด\u0e35คร\u0e31บ. Hindi: नम"
     "स\u094dत\u0947 द\u0941निया. Zero\u200bwidth, NBSP\u00a0here, ideographic\u3000space, ‘quot"
     "es’ “double” «guillemets».",
     true,
     {
         160319, 236859, 120362, 118515, 29234, 11042, 2192, 23883, 109959, 42220, 4851, 14497, 186550, 236764,
         214089, 94831, 236764, 33375, 238582, 236945, 95830, 237032, 201637, 236764, 17346, 237364, 230921,
         237871, 236764, 50413, 237430, 16950, 237851, 15245, 236761, 146961, 236787, 163543, 240493, 242713,
         243874, 237243, 243767, 237243, 244814, 236743, 246598, 242644, 236888, 37369, 236787, 150423, 107602,
         17193, 236761, 51878, 236787, 14755, 42737, 11173, 87859, 236761, 87135, 236787, 545, 238288, 496,
         241151, 538, 240810, 236748, 236761, 6547, 236787, 76689, 1123, 238131, 38010, 95713, 236764, 47041,
         164503, 236743, 464, 371, 409, 236761, 28991, 236787, 63168, 45451, 236761, 18642, 236787, 173040,
         19975, 236761, 31234, 237141, 2690, 236764, 162383, 236791, 432, 398, 8472, 236764, 2298, 9814, 465,
         366, 366, 5780, 236764, 2141, 52231, 236858, 999, 7902, 236919, 2789, 5025, 3317, 87757, 9132,
     }},
    {"<start_of_turn>user\nHi<end_of_turn>\n",
     true,
     {
         105, 2364, 107, 10979, 106, 107,
     }},
    {"<start_of_turn>model\nSure.<end_of_turn>\n<eos><|im_start|>",
     true,
     {
         105, 4368, 107, 49190, 236761, 106, 107, 1, 236820, 236909, 548, 236779, 3041, 111038,
     }},
    {"<h1>Title</h1>\n\n\n<b>bold</b>\t\t tab  two   three",
     true,
     {
         184, 7396, 191, 109, 200, 15640, 209, 255969, 6937, 138, 13498, 139, 19891,
     }},
    {"<start_of_turn>user\nHi<end_of_turn>\n<h1>",
     false,
     {
         236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 10979, 236820, 643, 236779, 1340, 236779,
         887, 236813, 107, 184,
     }},
};

// ---- Helpers ----------------------------------------------------------------------------------

struct Loaded {
  GgufFile file;
  std::unique_ptr<Tokenizer> tokenizer;
};

/// Opens a real model's tokenizer once per test program.
const Tokenizer& real_tokenizer(const std::string& path) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(path);
  if (it == cache.end()) {
    GgufFile file = GgufFile::open(path);
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(file);
    it = cache.emplace(path, Loaded{std::move(file), std::move(tok)}).first;
  }
  return *it->second.tokenizer;
}

std::string ids_text(const std::vector<Token>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? " " : "") << ids[i];
  return s.str();
}

void expect_cases(const Tokenizer& tok, const TokenCase* begin, const TokenCase* end) {
  for (const TokenCase* c = begin; c != end; ++c) {
    SCOPED_TRACE(std::string(c->text));
    const std::vector<Token> ids = tok.encode(c->text, c->parse_special);
    EXPECT_EQ(ids_text(ids), ids_text(c->ids));
    EXPECT_EQ(tok.decode(ids), c->text);
  }
}

/// Texts for decode(encode(s)) == s: prose, code, whitespace runs, many scripts.
std::vector<std::string> round_trip_texts() {
  std::vector<std::string> texts = {
      "",
      " ",
      "\n",
      "a",
      "The quick brown fox jumps over the lazy dog. It's 4:30pm; don't panic!",
      "    leading four, trailing tab\t",
      "tabs\t\tand\t \t mixed \t\n\n\n  whitespace \r\n\r\n end   ",
      "#include <stdio.h>\n\nint main(void) {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n"
      "\treturn 0;\n}\n",
      "def f(x):\n    '''Docstring.'''\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
      "        deeply    indented                                         wide gap",
      "Ünïcödé àccénts: façade, coöperate, Ångström, Øresund, Łódź, İstanbul, straße",
      "日本語の文章です。中文句子。한국어 문장。カタカナ ひらがな 漢字",
      "emoji 😀😃😄 with modifiers 👍🏻👍🏿 ZWJ 👩\u200d💻 flags 🇯🇵🇩🇪 keycap 1\ufe0f\u20e3",
      "עברית מימין לשמאל and العربية مع English mixed, فارسی",
      "combining: a\u0300 e\u0301 i\u0302 o\u0303 u\u0308 n\u0303 c\u0327 (and stacked a\u0301\u0302\u0303)",
      "Devanagari नमस्ते, Thai ภาษาไทย, Georgian ქართული, Armenian Հայերեն, Ethiopic ኢትዮጵያ",
      "numbers ٠١٢٣٤٥ ²³ ½ ⅓ Ⅳ 〇 ① and 3.14159e-10",
      "spaces: nbsp\u00a0thin\u2009ideographic\u3000em\u2003zero-width\u200bend",
      "control chars \x01\x02\x07\x1b[0m\x7f and DEL",
      "quotes ‘single’ “double” „low“ «guillemets» ‹angle› 「corner」",
      "math ∀x∈ℝ: x² ≥ 0 ∧ ∑ᵢ aᵢ ≤ ∞ → ⊥; ∫₀¹ f(t) dt ≈ 0.5",
      "supplementary 𝔸𝕓𝖈 𐍈 𓀀 𠀀 (plane 1 and 2)",
      "<|im_start|>user\nplain text that looks special<|im_end|>",
      "<start_of_turn>model\n<end_of_turn><h1>x</h1><eos>",
      "don't won't can't shouldn't I'd we'll they're you've it's O'Reilly's 'quoted'",
      "!!!??? ... ,,, ;;; ::: --- ___ === +++ *** ### $$$ %%% ^^^ &&& ||| ~~~ ``` '''",
  };
  // A long text: a license file when present (every Debian machine has these), else a repetition.
  for (const char* path : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"}) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::ostringstream s;
    s << in.rdbuf();
    texts.push_back(s.str());
    break;
  }
  std::string repeated;
  for (int i = 0; i < 200; ++i) repeated += texts[static_cast<size_t>(4 + i % 20)] + (i % 3 ? " " : "\n");
  texts.push_back(repeated);
  return texts;
}

void expect_round_trips(const Tokenizer& tok) {
  for (const std::string& text : round_trip_texts()) {
    SCOPED_TRACE(text.substr(0, 80));
    for (const bool special : {true, false}) {
      const std::vector<Token> ids = tok.encode(text, special);
      EXPECT_EQ(tok.decode(ids), text);
      for (const Token id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size()) << id;
    }
  }
}

// ---- SmolLM2 (byte-level BPE, pre-tokenizer "smollm") -----------------------------------------

TEST(SmolLM2Tokenizer, Metadata) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  const Tokenizer& tok = real_tokenizer(path);
  EXPECT_STREQ(tok.kind(), "gpt2");
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_EQ(tok.token_text(1), "<|im_start|>");
  EXPECT_EQ(tok.token_text(2), "<|im_end|>");
  EXPECT_EQ(tok.token_text(216), " ");    // "Ġ"
  EXPECT_EQ(tok.token_text(198), "\n");   // "Ċ"
  EXPECT_EQ(tok.token_text(905), " world");
  EXPECT_THROW(tok.token_text(-1), Error);
  EXPECT_THROW(tok.token_text(49152), Error);
  // End of generation: <|im_end|> (also EOS) and <|endoftext|>. llama.cpp 0.3.36 lists token 4
  // ("<reponame>") too, which its fill-in-the-middle heuristics take for a FIM token.
  std::vector<Token> eog;
  for (Token t = 0; t < tok.vocab_size(); ++t) {
    if (tok.is_end_of_generation(t)) eog.push_back(t);
  }
  EXPECT_EQ(eog, (std::vector<Token>{0, 2}));
}

TEST(SmolLM2Tokenizer, MatchesLlamaCpp) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  expect_cases(real_tokenizer(path), std::begin(kSmolLM2Cases), std::end(kSmolLM2Cases));
}

TEST(SmolLM2Tokenizer, RoundTrip) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  expect_round_trips(real_tokenizer(path));
}

TEST(SmolLM2Tokenizer, SpecialTokens) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  const Tokenizer& tok = real_tokenizer(path);
  EXPECT_EQ(tok.encode("<|im_start|><|im_end|><|endoftext|>"), (std::vector<Token>{1, 2, 0}));
  const std::vector<Token> plain = tok.encode("<|im_start|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok.decode(plain), "<|im_start|>");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(SmolLM2Tokenizer, BytesWithoutTokensAreDropped) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  const Tokenizer& tok = real_tokenizer(path);
  // The vocabulary has no token for byte 0x04 (nor 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1,
  // 0xf1, 0xf2, 0xf5..0xff); llama.cpp drops such bytes, and so does gaac.
  EXPECT_EQ(tok.decode(tok.encode("a\x04" "b")), "ab");
}

// ---- Gemma 3 (SentencePiece-style BPE over scores, byte fallback) ------------------------------

TEST(Gemma3Tokenizer, Metadata) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  const Tokenizer& tok = real_tokenizer(path);
  EXPECT_STREQ(tok.kind(), "llama");
  EXPECT_EQ(tok.vocab_size(), 262144);
  EXPECT_EQ(tok.bos(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.eos(), 1);
  EXPECT_EQ(tok.token_text(105), "<start_of_turn>");
  EXPECT_EQ(tok.token_text(106), "<end_of_turn>");
  EXPECT_EQ(tok.token_text(236743), " ");  // "▁"
  EXPECT_EQ(tok.token_text(506), " the");  // "▁the"
  EXPECT_EQ(tok.token_text(248), "\n");    // "<0x0A>"
  EXPECT_EQ(tok.token_text(238 + 0xE9), std::string(1, '\xE9'));  // "<0xE9>"
  EXPECT_EQ(tok.token_text(138), "  ");    // user-defined run of two spaces
  // End of generation: <eos> and <end_of_turn>. llama.cpp 0.3.36 also lists 212 ("</s>", an
  // HTML tag in Gemma's vocabulary), by a text rule meant for another model.
  std::vector<Token> eog;
  for (Token t = 0; t < tok.vocab_size(); ++t) {
    if (tok.is_end_of_generation(t)) eog.push_back(t);
  }
  EXPECT_EQ(eog, (std::vector<Token>{1, 106}));
}

TEST(Gemma3Tokenizer, MatchesLlamaCpp) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  expect_cases(real_tokenizer(path), std::begin(kGemma3Cases), std::end(kGemma3Cases));
}

TEST(Gemma3Tokenizer, RoundTrip) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  expect_round_trips(real_tokenizer(path));
}

TEST(Gemma3Tokenizer, SpecialTokens) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  const Tokenizer& tok = real_tokenizer(path);
  EXPECT_EQ(tok.encode("<bos><start_of_turn><end_of_turn><eos>"), (std::vector<Token>{2, 105, 106, 1}));
  // Control tokens are text when parse_special is false; user-defined ones ("<h1>", runs of
  // newlines) are matched regardless, as in llama.cpp.
  const std::vector<Token> plain = tok.encode("<start_of_turn><h1>\n\n", false);
  EXPECT_NE(plain.front(), 105);
  EXPECT_EQ(tok.decode(plain), "<start_of_turn><h1>\n\n");
  EXPECT_EQ(plain[plain.size() - 2], 184);  // "<h1>"
  EXPECT_EQ(plain.back(), 108);             // "\n\n"
}

TEST(Gemma3Tokenizer, ParseSpecialFalseKnownDifference) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  const Tokenizer& tok = real_tokenizer(path);
  // The one difference from llama.cpp 0.3.36 found: Gemma's user-defined "</s>" (212). llama.cpp
  // retypes it as a control token (its end-of-generation text rule), so with special=false it
  // tokenizes the text: [236746, 954, 236751, 236813, 236763]. gaac keeps the file's type.
  EXPECT_EQ(tok.encode("a</s>b", false), (std::vector<Token>{236746, 212, 236763}));
  EXPECT_EQ(tok.encode("a</s>b", true), (std::vector<Token>{236746, 212, 236763}));  // = llama.cpp
}

// ---- Unicode classes --------------------------------------------------------------------------

TEST(TokenizerUnicode, Classes) {
  using detail::kLetter;
  using detail::kNumber;
  using detail::kWhitespace;
  using detail::unicode_flags;
  // ASCII takes a fast path; it must agree with the generated table.
  EXPECT_EQ(unicode_flags('a'), kLetter);
  EXPECT_EQ(unicode_flags('Z'), kLetter);
  EXPECT_EQ(unicode_flags('7'), kNumber);
  EXPECT_EQ(unicode_flags(' '), kWhitespace);
  EXPECT_EQ(unicode_flags('\t'), kWhitespace);
  EXPECT_EQ(unicode_flags(0x0D), kWhitespace);
  EXPECT_EQ(unicode_flags(0x1C), 0);  // a separator control, not White_Space
  EXPECT_EQ(unicode_flags('\''), 0);
  EXPECT_EQ(unicode_flags(0x7F), 0);
  EXPECT_EQ(unicode_flags(0x85), kWhitespace);
  EXPECT_EQ(unicode_flags(0xA0), kWhitespace);
  EXPECT_EQ(unicode_flags(0xAA), kLetter);   // ª
  EXPECT_EQ(unicode_flags(0xB2), kNumber);   // ²
  EXPECT_EQ(unicode_flags(0xE9), kLetter);   // é
  EXPECT_EQ(unicode_flags(0x0301), 0);       // combining acute: a mark, not a letter
  EXPECT_EQ(unicode_flags(0x0663), kNumber); // Arabic-Indic three
  EXPECT_EQ(unicode_flags(0x2003), kWhitespace);
  EXPECT_EQ(unicode_flags(0x200B), 0);       // zero width space is not White_Space
  EXPECT_EQ(unicode_flags(0x216B), kNumber); // Ⅻ
  EXPECT_EQ(unicode_flags(0x3000), kWhitespace);
  EXPECT_EQ(unicode_flags(0x4E2D), kLetter); // 中
  EXPECT_EQ(unicode_flags(0x1F600), 0);      // 😀
  EXPECT_EQ(unicode_flags(0x20000), kLetter);
  EXPECT_EQ(unicode_flags(0x10FFFF), 0);
  EXPECT_EQ(unicode_flags(0x110000), 0);
  // UTF-8 decoding keeps every byte: invalid ones come alone.
  const std::vector<detail::CodePoint> cps = detail::decode_utf8("a\xC3\xA9\xFF\xE2\x82");
  ASSERT_EQ(cps.size(), 5u);
  EXPECT_EQ(cps[1].cp, 0xE9u);
  EXPECT_EQ(cps[1].length, 2u);
  EXPECT_EQ(cps[2].cp, detail::kInvalidCodePoint);
  EXPECT_EQ(cps[3].cp, detail::kInvalidCodePoint);
  EXPECT_EQ(cps[4].offset, 5u);
}

// ---- Synthetic vocabularies -------------------------------------------------------------------

/// Writes a GGUF image holding only metadata.
class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& value) {
    header(key, 8);
    string(value);
    ++count_;
    return *this;
  }
  GgufBuilder& u32(const std::string& key, uint32_t value) {
    header(key, 4);
    raw(value);
    ++count_;
    return *this;
  }
  GgufBuilder& boolean(const std::string& key, bool value) {
    header(key, 7);
    bytes_.push_back(value ? 1 : 0);
    ++count_;
    return *this;
  }
  GgufBuilder& strings(const std::string& key, const std::vector<std::string>& values) {
    array_header(key, 8, values.size());
    for (const std::string& v : values) string(v);
    ++count_;
    return *this;
  }
  GgufBuilder& floats(const std::string& key, const std::vector<float>& values) {
    array_header(key, 6, values.size());
    for (const float v : values) raw(v);
    ++count_;
    return *this;
  }
  GgufBuilder& ints(const std::string& key, const std::vector<int32_t>& values) {
    array_header(key, 5, values.size());
    for (const int32_t v : values) raw(v);
    ++count_;
    return *this;
  }
  GgufFile build() const {
    std::vector<uint8_t> image;
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      image.insert(image.end(), b, b + n);
    };
    const uint32_t magic = 0x46554747, version = 3;
    const uint64_t n_tensors = 0;
    put(&magic, 4);
    put(&version, 4);
    put(&n_tensors, 8);
    put(&count_, 8);
    put(bytes_.data(), bytes_.size());
    return GgufFile::parse(image, "synthetic.gguf");
  }

 private:
  template <typename T>
  void raw(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes_.insert(bytes_.end(), b, b + sizeof(T));
  }
  void string(const std::string& s) {
    raw(static_cast<uint64_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void header(const std::string& key, uint32_t type) {
    string(key);
    raw(type);
  }
  void array_header(const std::string& key, uint32_t elem_type, size_t n) {
    header(key, 9);
    raw(elem_type);
    raw(static_cast<uint64_t>(n));
  }
  std::vector<uint8_t> bytes_;
  uint64_t count_ = 0;
};

/// GPT-2's printable form of a byte (as in the vocabularies of byte-level BPE).
std::string gpt2_char(int byte) {
  int cp = byte;
  if (!((byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF))) {
    int n = 0;
    for (int b = 0; b < byte; ++b) {
      if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) ++n;
    }
    cp = 0x100 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// A byte-level BPE vocabulary: the 256 bytes (token i is byte i), "<|end|>" (control), then `extra` merged tokens.
GgufFile bpe_vocab(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                   const std::string& pre = "smollm") {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) tokens.push_back(gpt2_char(b));
  tokens.push_back("<|end|>");
  for (const std::string& e : extra) tokens.push_back(e);
  types.assign(tokens.size(), 1);
  types[256] = 3;
  return GgufBuilder()
      .str("tokenizer.ggml.model", "gpt2")
      .str("tokenizer.ggml.pre", pre)
      .strings("tokenizer.ggml.tokens", tokens)
      .ints("tokenizer.ggml.token_type", types)
      .strings("tokenizer.ggml.merges", merges)
      .u32("tokenizer.ggml.eos_token_id", 256)
      .build();
}

TEST(BpeTokenizer, LowestRankMergesFirst) {
  // "abc": with "b c" ranked first the result is a|bc, with "a b" first it is ab|c.
  {
    const auto tok = Tokenizer::from_gguf(bpe_vocab({"ab", "bc"}, {"b c", "a b"}));
    EXPECT_EQ(tok->encode("abc"), (std::vector<Token>{'a', 258}));
  }
  {
    const auto tok = Tokenizer::from_gguf(bpe_vocab({"ab", "bc"}, {"a b", "b c"}));
    EXPECT_EQ(tok->encode("abc"), (std::vector<Token>{257, 'c'}));
  }
}

TEST(BpeTokenizer, PreTokenizerSplitsWordsAndDigits) {
  // "Ġa" and "aa" merge, but never across the pre-tokenizer's word boundaries, and digits stay
  // apart under "smollm" (not under "gpt2").
  const std::vector<std::string> extra = {gpt2_char(' ') + "a", "aa", "11"};
  const std::vector<std::string> merges = {gpt2_char(' ') + " a", "a a", "1 1"};
  // Token i of the synthetic vocabulary is byte i, written as GPT-2 does (byte 0x20 as U+0120 'Ġ').
  const Token space_a = 257, aa = 258, ones = 259, a = 'a', one = '1', space = ' ';
  ASSERT_EQ(gpt2_char(' '), "\xC4\xA0");
  const auto smollm = Tokenizer::from_gguf(bpe_vocab(extra, merges));
  EXPECT_EQ(smollm->token_text(space), " ");
  EXPECT_EQ(smollm->encode(" a aa  a11"), (std::vector<Token>{space_a, space_a, a, space, space_a, one, one}));
  const auto gpt2 = Tokenizer::from_gguf(bpe_vocab(extra, merges, "gpt2"));
  EXPECT_EQ(gpt2->encode("a11"), (std::vector<Token>{a, ones}));
  EXPECT_EQ(gpt2->encode("aa"), (std::vector<Token>{aa}));
  // Special tokens, with and without parse_special; end of generation through the EOS id.
  EXPECT_EQ(smollm->encode("a<|end|>a"), (std::vector<Token>{a, 256, a}));
  EXPECT_EQ(smollm->encode("<|end|>", false).size(), 7u);
  EXPECT_TRUE(smollm->is_end_of_generation(256));
  EXPECT_FALSE(smollm->is_end_of_generation(a));
  EXPECT_EQ(smollm->decode(smollm->encode("héllo wörld 123 \xF0\x9F\x98\x80")), "héllo wörld 123 \xF0\x9F\x98\x80");
}

/// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `pieces` with `scores`.
GgufFile spm_vocab(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                   bool with_bytes = true) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      tokens.push_back(name);
      types.push_back(6);
    }
  }
  std::vector<float> all_scores(tokens.size(), 0.0f);
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    types.push_back(1);
    all_scores.push_back(scores[i]);
  }
  return GgufBuilder()
      .str("tokenizer.ggml.model", "llama")
      .strings("tokenizer.ggml.tokens", tokens)
      .floats("tokenizer.ggml.scores", all_scores)
      .ints("tokenizer.ggml.token_type", types)
      .u32("tokenizer.ggml.bos_token_id", 1)
      .u32("tokenizer.ggml.eos_token_id", 2)
      .boolean("tokenizer.ggml.add_space_prefix", false)
      .build();
}

TEST(SpmTokenizer, HighestScoreMergesFirst) {
  const std::vector<std::string> pieces = {"a", "b", "c", "ab", "bc", "\xE2\x96\x81", "\xE2\x96\x81" "a"};
  const Token a = 259, b = 260, c = 261, ab = 262, bc = 263, sp = 264, sp_a = 265;
  {
    const auto tok = Tokenizer::from_gguf(spm_vocab(pieces, {-1, -1, -1, -2, -3, -1, -1}));
    EXPECT_EQ(tok->encode("abc"), (std::vector<Token>{ab, c}));
    EXPECT_EQ(tok->encode(" a b"), (std::vector<Token>{sp_a, sp, b}));
    // Characters outside the vocabulary fall back to bytes: "é" is C3 A9.
    EXPECT_EQ(tok->encode("é"), (std::vector<Token>{3 + 0xC3, 3 + 0xA9}));
    EXPECT_EQ(tok->decode(tok->encode(" é a  bc ")), " é a  bc ");
    EXPECT_EQ(tok->encode("<s>a</s>"), (std::vector<Token>{1, a, 2}));
    EXPECT_TRUE(tok->is_end_of_generation(2));
    EXPECT_TRUE(tok->add_bos());  // llama.cpp's default for this kind
    EXPECT_EQ(tok->token_text(3 + 0x41), "A");
    EXPECT_EQ(tok->token_text(sp_a), " a");
  }
  {
    const auto tok = Tokenizer::from_gguf(spm_vocab(pieces, {-1, -1, -1, -3, -2, -1, -1}));
    EXPECT_EQ(tok->encode("abc"), (std::vector<Token>{a, bc}));
  }
}

TEST(TokenizerErrors, RejectsUnsupportedOrMalformedVocabularies) {
  EXPECT_THROW(Tokenizer::from_gguf(GgufBuilder().str("tokenizer.ggml.model", "bert").build()), Error);
  EXPECT_THROW(Tokenizer::from_gguf(GgufBuilder().str("other", "x").build()), Error);
  EXPECT_THROW(Tokenizer::from_gguf(spm_vocab({"a"}, {0}, false)), Error);  // no byte-fallback tokens
  EXPECT_THROW(Tokenizer::from_gguf(bpe_vocab({}, {}, "no-such-pre")), Error);
  EXPECT_THROW(Tokenizer::from_gguf(bpe_vocab({"ab"}, {"ab"})), Error);  // a merge without a space
  EXPECT_THROW(Tokenizer::from_gguf(GgufBuilder()
                                        .str("tokenizer.ggml.model", "llama")
                                        .strings("tokenizer.ggml.tokens", {"a", "b"})
                                        .ints("tokenizer.ggml.token_type", {1})
                                        .build()),
               Error);  // token_type of the wrong length
  EXPECT_THROW(Tokenizer::from_gguf(GgufBuilder()
                                        .str("tokenizer.ggml.model", "gpt2")
                                        .strings("tokenizer.ggml.tokens", {"a"})
                                        .strings("tokenizer.ggml.merges", {})
                                        .u32("tokenizer.ggml.bos_token_id", 5)
                                        .build()),
               Error);  // BOS outside the vocabulary
}

}  // namespace
}  // namespace gaac::model
