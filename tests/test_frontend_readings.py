"""Texts the official frontend reads wrongly and cosyvino reads better (issue 19 item 11).

One test per case with the exact normalized text; ``official`` is what the official frontend
(upstream HEAD + wetext 0.1.8, i.e. cosyvino before these rules) gives, listed with the reason
in docs/frontend.md ("Text read better than the official frontend"). ``UNCHANGED`` holds
neighbouring texts whose (already right) reading must stay as it was. A property test checks
that every word of every input survives exactly as often in the output.
"""

from __future__ import annotations

import unicodedata

import pytest
import regex

from cosyvino.frontend import TextTokenizer, normalize, normalize_and_split
from cosyvino.frontend.addresses import find_spans, read_span, rewrite_versions_en
from cosyvino.frontend.cjk_numbers import cardinal_ja, cardinal_ko, read_numbers_ko
from cosyvino.frontend.fullwidth import ALWAYS_FOLDED, fold_fullwidth
from cosyvino.frontend.normalize import text_path
from cosyvino.frontend.rules import (
    rewrite_hyphen_zh,
    rewrite_money_en,
    rewrite_symbol_before_unit_zh,
    rewrite_thousands_en,
    rewrite_thousands_zh,
)

# name: (input, cosyvino's normalized text, the official normalized text)
CASES = {
    # -- currency amounts with a symbol and decimals (English) --
    "usd_cents": ("It costs $12.50 today", "It costs twelve dollars and fifty cents today",
                  "It costs twelve point five dollars today"),
    "usd_thousands_cents": (
        "It costs $1,234.56", "It costs one thousand two hundred and thirty four dollars and "
        "fifty six cents", "It costs thousand two hundred and thirty four point five six dollars"),
    "usd_cents_only": ("The price is $0.99.", "The price is ninety nine cents.",
                       "The price is zero point nine nine dollars."),
    "usd_singular": ("Pay $1.01 now", "Pay one dollar and one cent now",
                     "Pay one point oh one dollars now"),
    "usd_tenths": ("Only $2.5 each", "Only two dollars and fifty cents each",
                   "Only two point five dollars each"),
    "eur_cents": ("€3.99 each", "three euros and ninety nine cents each",
                  "three point nine nine euros each"),
    "gbp_pence": ("£5.05 a week", "five pounds and five pence a week",
                  "five point oh five pounds a week"),
    "usd_no_separator": ("A $1500 laptop", "A one thousand five hundred dollars laptop",
                         "A thousand five hundred dollars laptop"),
    # -- thousands separators --
    "en_thousands_one": ("There were 1,234 people", "There were one thousand two hundred and "
                         "thirty four people",
                         "There were thousand two hundred and thirty four people"),
    "en_thousands_round": ("We got 1,000 votes", "We got one thousand votes",
                           "We got thousand votes"),
    "en_thousands_decimal": ("It is 1,234.5 miles away", "It is one thousand two hundred and "
                             "thirty four point five miles away",
                             "It is thousand two hundred and thirty four point five miles away"),
    "zh_thousands_decimal": ("共1,234.56美元", "共一千二百三十四点五六美元",
                             "共一,两百三十四点五六美元"),
    "zh_thousands_money": ("总价$1,234.56", "总价一千二百三十四点五六美元",
                           "总价一美元,两百三十四点五六"),
    # -- "." inside URLs, e-mail addresses, names and version numbers (Chinese) --
    "zh_www": ("请访问 www.example.com 了解详情", "请访问www点example点com了解详情",
               "请访问www。example。com了解详情"),
    "zh_url": ("访问https://github.com/FunAudioLLM/CosyVoice。",
               "访问https://github点com/FunAudioLLM/CosyVoice。",
               "访问https://github。com/FunAudioLLM/CosyVoice。"),
    "zh_email": ("发邮件到 john.doe@example.com 联系我们", "发邮件到john点doe@example点com联系我们",
                 "发邮件到john。doe@example。com联系我们"),
    "zh_url_digits": ("网易的网址是www.163.com", "网易的网址是www点一六三点com",
                      "网易的网址是www。一百六十三。com"),
    "zh_file_name": ("配置文件是config.yaml", "配置文件是config点yaml",
                     "配置文件是config。yaml"),
    "zh_version": ("请升级到 v2.3.1 版本", "请升级到v二点三点一版本", "请升级到v二。三点一版本"),
    "zh_version_two_digits": ("请使用v2.10版", "请使用v二点十版", "请使用v二点一零版"),
    # -- versions in English --
    "en_version": ("Version 2.3.1 is out", "Version two point three point one is out",
                   "Version two.three point one is out"),
    # -- digits inside Korean text (Sino-Korean; native before native counters) --
    "ko_counter": ("나는 3개의 사과가 있어요", "나는 세개의 사과가 있어요", "나는 three개의 사과가 있어요"),
    "ko_date": ("2024년 3월 5일입니다", "이천이십사년 삼월 오일입니다",
                "two thousand and twenty-four년 three월 five일입니다"),
    "ko_thousands": ("가격은 1,500원입니다", "가격은 천오백원입니다", "가격은 one,five hundred원입니다"),
    "ko_phone": ("전화번호는 010-1234-5678입니다", "전화번호는 공일공-일이삼사-오육칠팔입니다",
                 "전화번호는 ten-one thousand, two hundred and thirty-four-five thousand, six "
                 "hundred and seventy-eight입니다"),
    "ko_decimal": ("무게는 3.5킬로그램", "무게는 삼점오킬로그램", "무게는 three.five킬로그램"),
    "ko_percent": ("50% 할인", "오십퍼센트 할인", "fifty percent 할인"),
    "ko_ordinal_prefix": ("제3장을 읽어요", "제삼장을 읽어요", "제three장을 읽어요"),
    "ko_age": ("20살이에요", "스무살이에요", "twenty살이에요"),
    "ko_time": ("3시 30분에 만나요", "세시 삼십분에 만나요", "three시 thirty분에 만나요"),
    "ko_clock": ("10:30에 만나요", "열시삼십분에 만나요", "ten:thirty에 만나요"),
    "ko_after_phone": ("010-1234-5678로 3개 보내요", "공일공-일이삼사-오육칠팔로 세개 보내요",
                       "ten-one thousand, two hundred and thirty-four-five thousand, six hundred "
                       "and seventy-eight로 three개 보내요"),
    "ko_site": ("사이트는 www.naver.com 입니다", "사이트는 www 점 naver 점 com 입니다",
                "사이트는 WWW dot naver dot com 입니다"),
    # -- digits inside Japanese text (kanji numerals) --
    "ja_year": ("2024年3月5日です", "二千二十四年三月五日です", "二零二四年三月五日です"),
    "ja_kana_only": ("これは3です", "これは三です", "これはthreeです"),
    "ja_price": ("価格は1500円です", "価格は千五百円です", "価格は一千五百円です"),
    "ja_percent": ("50%オフです", "五十パーセントオフです", "fifty%オフです"),
    "ja_percent_kanji": ("割引は50%です", "割引は五十パーセントです", "割引は百分之五十です"),
    "ja_phone": ("電話は090-1234-5678です", "電話は零九零-一二三四-五六七八です",
                 "電話は零九零一二三四五六七八です"),
    "ja_clock": ("10:30に会いましょう", "十時三十分に会いましょう", "十点三十分に会いましょう"),
    "ja_version": ("バージョン2.3.1です", "バージョン二ドット三ドット一です",
                   "バージョンtwo.three.oneです"),
    # -- a hyphen between letters and digits read as "minus" (Chinese) --
    "zh_hyphen_covid": ("新冠COVID-19疫情", "新冠COVID十九疫情", "新冠COVID负十九疫情"),
    "zh_hyphen_model": ("型号为RTX-4090的显卡", "型号为RTX四千零九十的显卡",
                        "型号为RTX负四千零九十的显卡"),
    "zh_hyphen_twice": ("SARS-CoV-2病毒", "SARS-CoV二病毒", "SARS-CoV负二病毒"),
    # -- a currency symbol amount followed by a currency word (Chinese, issue 33) --
    "zh_yen_and_yuan": ("¥299.9元", "两百九十九点九元", "二元九十九点九元"),
    "zh_fullwidth_yen_and_yuan": ("价格￥299.9元", "价格两百九十九点九元", "价格二元九十九点九元"),
    "zh_yen_one_digit_and_yuan": ("¥2元", "两元", "¥两元"),
    "zh_dollar_and_usd": ("$5美元", "五美元", "五美元美元"),
    "zh_yen_scale_and_yuan": ("¥1.5万元", "一点五万元", "¥一点五万元"),
    # -- full-width forms read as their half-width forms (issue 33) --
    "zh_fullwidth_dollar": ("价格＄5", "价格五美元", "价格＄五"),
    "zh_fullwidth_percent": ("涨了５０％", "涨了百分之五十", "涨了五十％"),
    "zh_fullwidth_decimal": ("气温１５．５度", "气温十五点五度", "气温十五．五度"),
    "zh_fullwidth_grouped": ("共１，２３４．５６美元", "共一千二百三十四点五六美元",
                             "共一，两百三十四．五十六美元"),
    "zh_fullwidth_letters": ("ＡＢＣ公司", "ABC公司", "ＡＢＣ公司"),
    "zh_fullwidth_range": ("３～５天", "三到五天", "三～五天"),
    "zh_fullwidth_minus": ("温度－3度", "温度负三度", "温度－三度"),
    "zh_fullwidth_fraction": ("３／４杯", "四分之三杯", "三／四杯"),
    "zh_fullwidth_hyphen": ("COVID－19疫情", "COVID十九疫情", "COVID－十九疫情"),
    "zh_fullwidth_clock": ("１０：３０开会", "十点三十分开会", "十：三十开会"),
    "zh_fullwidth_www": ("请访问ｗｗｗ．ｅｘａｍｐｌｅ．ｃｏｍ了解", "请访问www点example点com了解",
                         "请访问ｗｗｗ．ｅｘａｍｐｌｅ．ｃｏｍ了解"),
    "en_fullwidth_money": ("It costs ＄１２．５０ today",
                           "It costs twelve dollars and fifty cents today",
                           "It costs ＄twelve．fifty today"),
    "en_fullwidth_yen": ("It costs ￥500", "It costs five hundred yen", "It costs ￥five hundred"),
    "en_fullwidth_pence": ("￡５．０５ a week", "five pounds and five pence a week",
                           "￡five．five a week"),
    "en_fullwidth_percent": ("５０％ off", "fifty percent off", "fifty％ off"),
    "en_fullwidth_plus_equals": ("３＋５＝８", "three plus five equals eight",
                                 "three＋five＝eight"),
    "en_fullwidth_email": ("Mail john.doe＠example.com now",
                           "Mail john dot doe at example dot com now",
                           "Mail john.doe＠example dot com now"),
    "en_fullwidth_letters": ("ｈｅｌｌｏ ｗｏｒｌｄ ＆ you", "hello world and you",
                             "ｈｅｌｌｏ ｗｏｒｌｄ ＆ you"),
    "ja_fullwidth_percent": ("５０％オフです", "五十パーセントオフです", "五十％オフです"),
    "ja_fullwidth_grouped": ("価格は１，５００円です", "価格は千五百円です", "価格は一，五百円です"),
    "ko_fullwidth_decimal": ("무게는 ３．５킬로그램", "무게는 삼점오킬로그램", "무게는 삼．오킬로그램"),
    "ko_fullwidth_grouped": ("가격은 １，５００원입니다", "가격은 천오백원입니다", "가격은 일，오백원입니다"),
}

# Readings that were already right and must not change (input, normalized text).
UNCHANGED = {
    "usd_whole": ("It costs $12", "It costs twelve dollars"),
    "usd_scale": ("$1.5 million", "one point five million dollars"),
    "yen_decimal": ("¥100.5", "one hundred point five yen"),
    "en_millions": ("1,234,567 people", "one million two hundred thirty four thousand five "
                    "hundred and sixty seven people"),
    "en_decimal": ("pi is 3.14", "pi is three point one four"),
    "en_url": ("Visit www.example.com today", "Visit WWW dot example dot com today"),
    "en_email": ("Mail john.doe@example.com now", "Mail john dot doe at example dot com now"),
    "en_ip": ("Connect to 192.168.1.1 now",
              "Connect to one nine two dot one six eight dot one dot one now"),
    "en_hyphen": ("COVID-19 is a disease", "COVID-nineteen is a disease"),
    "en_minus": ("5-3=2", "five minus three equals two"),
    "zh_decimal": ("Python 3.12 发布了", "Python三点一二发布了"),
    "zh_price": ("价格是12.5元", "价格是十二点五元"),
    "zh_millions": ("人口1,234,567人", "人口一百二十三万四千五百六十七人"),
    "zh_true_minus": ("温度-3度", "温度负三度"),
    "zh_abbreviation": ("美国U.S.A", "美国U。S。A"),
    # wetext reads these itself; cosyvino reads them as spans with the same result
    "zh_ip": ("服务器地址是192.168.1.1。", "服务器地址是一九二点一六八点一点一。"),
    "zh_dotted_date": ("发布于2024.3.5", "发布于二零二四年三月五日"),
    "zh_sentence": ("今天是2024年3月5日，气温15.5度，明天降温到-3℃。",
                    "今天是二零二四年三月五日，气温十五点五度，明天降温到负三摄氏度。"),
    "ja_counter": ("りんごが3個あります", "りんごが三個あります"),
    # a symbol amount without a currency word stays with wetext
    "zh_yen_alone": ("价格¥299", "价格两百九十九元"),
    # Chinese punctuation is never folded (the splitter cuts at it), full-width digits in
    # Chinese text already read right, ":" between digits and an enumeration keep their reading
    "zh_fullwidth_punctuation": ("今天，天气好！你呢？真的：是；", "今天，天气好！你呢？真的：是；"),
    "zh_fullwidth_digits": ("共１２３个", "共一百二十三个"),
    "zh_fullwidth_label_colon": ("第１：３个苹果", "第一：三个苹果"),
    "zh_enumeration": ("选项1，2，3都对", "选项一，二，三都对"),
    "zh_fullwidth_tag_like": ("＜｜en｜＞你好", "＜｜en｜＞你好"),
}

# Full-width text and its half-width form: read exactly alike (issue 33).
FULL_WIDTH_PAIRS = [
    ("￥299.9元", "¥299.9元"), ("￥２９９．９元", "¥299.9元"), ("＄5", "$5"), ("＄５", "$5"),
    ("５０％", "50%"), ("１２３", "123"), ("价格＄１２．５０", "价格$12.50"),
    ("涨了５０％", "涨了50%"), ("共１，２３４，５６７．８９元", "共1,234,567.89元"),
    ("ＲＴＸ－４０９０显卡", "RTX-4090显卡"), ("３－５页", "3-5页"), ("１０：３０开会", "10:30开会"),
    ("Ｉｔ ｃｏｓｔｓ ＄１，２３４．５６", "It costs $1,234.56"), ("€５ ＆ ￡３", "€5 & £3"),
    ("５０％オフです", "50%オフです"), ("５０％ 할인", "50% 할인"),
    ("０９０－１２３４－５６７８です", "090-1234-5678です"),
]


@pytest.mark.parametrize("name", list(CASES))
def test_reading(name):
    text, ours, official = CASES[name]
    assert ours != official
    assert normalize(text) == ours


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_reading_unchanged(name):
    text, expected = UNCHANGED[name]
    assert normalize(text) == expected


_WORD_RE = regex.compile(r"\p{L}+")


def _assert_words_kept_once(text: str, out: str) -> None:
    """Each letter run of ``text`` is found in ``out`` (longest first, each occurrence used up
    once); afterwards no input word of two or more letters is left in ``out`` (duplicated)."""
    # full-width letters are read as their half-width forms (NFKC), so compare those
    words = [unicodedata.normalize("NFKC", w).lower() for w in _WORD_RE.findall(text)]
    rest = out.lower()
    for word in sorted(words, key=len, reverse=True):
        i = rest.find(word)
        assert i >= 0, f"{word!r} of {text!r} dropped: {out!r}"
        rest = rest[:i] + "\0" + rest[i + len(word):]
    for word in set(words):
        assert len(word) < 2 or word not in rest, f"{word!r} of {text!r} duplicated: {out!r}"


@pytest.mark.parametrize("name", list(CASES) + list(UNCHANGED))
def test_every_word_survives_once(name):
    """Never drop or duplicate a word: for the normalized text and for the joined segments."""
    text = (CASES.get(name) or UNCHANGED[name])[0]
    _assert_words_kept_once(text, normalize(text))
    _assert_words_kept_once(text, "".join(normalize_and_split(text)))


@pytest.mark.parametrize("full,half", FULL_WIDTH_PAIRS, ids=[p[1] for p in FULL_WIDTH_PAIRS])
def test_full_width_reads_as_half_width(full, half):
    assert normalize(full) == normalize(half)
    assert normalize_and_split(full) == normalize_and_split(half)


def test_fold_fullwidth():
    assert fold_fullwidth("￥２９９．９元") == "¥299.9元"
    assert fold_fullwidth("５０％，ＡＢＣ＄＆＋／＝＠ｘｙｚ￠￡￦") == "50%，ABC$&+/=@xyz¢£₩"
    assert fold_fullwidth("１，２３４，５６７．８") == "1,234,567.8"
    assert fold_fullwidth("３～５天，－３度，ａ．ｂ") == "3~5天，-3度，a.b"
    # Chinese punctuation and the contextual forms outside numbers stay
    kept = "今天，天气好！你呢？是：的；（注）、【】「」……～好－的．1，2，12，3456：7"
    assert fold_fullwidth(kept) == kept
    assert fold_fullwidth("＜｜en｜＞") == "＜｜en｜＞"
    # every always-folded character becomes one ASCII (or Latin-1/currency) character
    for c in ALWAYS_FOLDED:
        folded = fold_fullwidth(c)
        assert len(folded) == 1 and folded != c and ord(folded) < 0x2100, c


def test_rewrite_symbol_before_unit_zh():
    assert rewrite_symbol_before_unit_zh("¥299.9元") == "299.9元"
    assert rewrite_symbol_before_unit_zh("共$ 5 美元") == "共5美元"
    assert rewrite_symbol_before_unit_zh("¥1.5万元和€3欧元") == "1.5万元和3欧元"
    assert rewrite_symbol_before_unit_zh("¥1,234块") == "1,234块"
    for text in ("¥299.9", "¥299个", "价格¥5，元旦", "299.9元"):
        assert rewrite_symbol_before_unit_zh(text) == text


def test_word_check_can_fail():
    with pytest.raises(AssertionError, match="dropped"):
        _assert_words_kept_once("COVID-19 cases", "nineteen cases")
    with pytest.raises(AssertionError, match="duplicated"):
        _assert_words_kept_once("www.example.com", "www example example com")


# -- segments: an address is one unit -------------------------------------------------------
def test_address_is_not_split_across_segments():
    tok = TextTokenizer()
    # official: "…www。" ends a piece; with 70 characters before it the merge emits it, so the
    # address is synthesized as two segments: ["甲…请访问www。", "example。com了解详情乙…。"]
    text = "甲" * 70 + "请访问www.example.com了解详情" + "乙" * 20 + "。"
    assert normalize_and_split(text, tok) == [
        "甲" * 70 + "请访问www点example点com了解详情" + "乙" * 20 + "。"]


def test_english_version_is_one_segment():
    # official: "Version two.three point one is out." (a terminator inside the number)
    assert normalize_and_split("Version 2.3.1 is out") == [
        "Version two point three point one is out."]


def test_japanese_text_is_split_at_japanese_sentence_ends():
    # official: kana-only text takes the English path, whose splitter ignores "。"
    tok = TextTokenizer()
    sentence = "これはとてもながいぶんしょうです。" * 8  # 136 characters
    segs = normalize_and_split(sentence, tok)
    assert len(segs) == 2 and "".join(segs) == sentence
    assert all(s.endswith("。") for s in segs)


# -- paths ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text,path", [
    ("Hello", "en"), ("你好", "zh"), ("안녕하세요", "ko"), ("こんにちは", "ja"),
    ("東京へ行きます", "ja"), ("日本", "zh"), ("한국어 中文", "zh"), ("ｶﾀｶﾅ", "ja"),
])
def test_text_path(text, path):
    assert text_path(text) == path


def test_korean_path_does_not_call_english_wetext(caplog):
    # official: wetext's English grammar asserts on Hangul, logged twice per text
    with caplog.at_level("WARNING"):
        assert normalize("안녕하세요 3번") == "안녕하세요 삼번"
    assert "wetext failed" not in caplog.text


# -- the rule functions ---------------------------------------------------------------------
def test_rewrite_money_en():
    assert rewrite_money_en("$12.50") == "12 dollars and 50 cents"
    assert rewrite_money_en("$ 1234.5") == "1,234 dollars and 50 cents"
    assert rewrite_money_en("$0.00") == "0 dollars"
    assert rewrite_money_en("$1") == "1 dollar"
    assert rewrite_money_en("£1.01") == "1 pound and 1 penny"
    assert rewrite_money_en("₩1,000") == "1,000 won"
    for kept in ("$12.505", "$1.5 million", "$2bn", "¥1.5", "US$5x", "a$5", "$12,5"):
        assert rewrite_money_en(kept) == kept, kept


def test_rewrite_thousands():
    assert rewrite_thousands_en("1,234 and 1,000 and 1,005") == (
        "1 thousand 234 and 1 thousand and 1 thousand 5")
    for kept in ("11,234", "1,234,567", "21,000", "1,23", "3.1,234"):
        assert rewrite_thousands_en(kept) == kept, kept
    assert rewrite_thousands_zh("1,234.56和12,345,678") == "1234.56和12345678"
    assert rewrite_thousands_zh("1,2,3和1,2345") == "1,2,3和1,2345"


def test_rewrite_hyphen_zh():
    assert rewrite_hyphen_zh("COVID-19和A-1") == "COVID 19和A 1"
    for kept in ("温度-3度", "苏-27", "3-5页", "K-pop", "A - 1"):
        assert rewrite_hyphen_zh(kept) == kept, kept


def test_find_spans():
    text = "见www.a.com和x@y.cn，版本v1.2与2.3.4，U.S.A，3.14，Node.js。"
    assert [text[a:b] for a, b in find_spans(text)] == [
        "www.a.com", "x@y.cn", "v1.2", "2.3.4", "Node.js"]
    assert find_spans("no spans here. 3.14") == []


def test_read_span():
    zh = read_span("a1.b22.c333.007", "zh", cardinal=lambda d: f"<{d}>",
                   by_digit=lambda d: f"[{d}]")
    assert zh == "a<1>点b<22>点c[333]点[007]"
    assert read_span("x.0", "ko", cardinal=str, by_digit=str) == "x 점 0"
    with pytest.raises(KeyError):
        read_span("a.b", "xx", cardinal=str, by_digit=str)


def test_rewrite_versions_en():
    assert rewrite_versions_en("v1.2 and 2.3.1 and 1.2.3.4.5") == (
        "v1 point 2 and 2 point 3 point 1 and 1 point 2 point 3 point 4 point 5")
    for kept in ("3.14", "192.168.1.1", "a2.3.1"):
        assert rewrite_versions_en(kept) == kept, kept


def test_cjk_cardinals():
    assert [cardinal_ko(d) for d in ("0", "10", "1500", "12345", "007")] == [
        "영", "십", "천오백", "만이천삼백사십오", "공공칠"]
    assert [cardinal_ja(d) for d in ("0", "10", "1500", "10000", "007")] == [
        "零", "十", "千五百", "一万", "零零七"]
    # beyond num2words' largest unit: digit by digit
    assert cardinal_ja("1" + "0" * 80) == "一" + "零" * 80
    assert read_numbers_ko("１２개") == "열두개"  # full-width digits
    assert read_numbers_ko("100개") == "백개"  # native only for 1..99
