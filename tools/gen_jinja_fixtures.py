#!/usr/bin/env python3
"""Generates the jinja2 reference fixtures for latent's Jinja interpreter (tests/jinja).

jinja2 is configured exactly as transformers configures it for chat templates
(transformers/utils/chat_template_utils.py, _compile_jinja_template): ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and a {% generation %} tag, `tojson` replaced by
json.dumps(ensure_ascii=False, ...), globals raise_exception and strftime_now. strftime_now reads a fixed clock
(FIXED_NOW) so that outputs are deterministic; the C++ tests install the same clock.

Writes (ASCII-escaped JSON lines):
  tests/data/jinja/snippets.jsonl        small templates x context -> expected output or expected exception
  tests/data/jinja/chat_templates.jsonl  every template x conversation x options -> output or exception

Usage: build/venv/bin/python tools/gen_jinja_fixtures.py [--check]
  --check  regenerate in memory and fail if the committed files differ.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
import warnings

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "jinja")
FIXED_NOW = datetime.datetime(2025, 3, 14, 15, 9, 26)  # the C++ tests use the same clock


# ---------------------------------------------------------------------------------------------------------------
# The transformers environment


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker without the tracking."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

    def _passthrough(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()
warnings.filterwarnings("ignore", category=SyntaxWarning)  # jinja2's compile-time folding of e.g. (1)[1:]


def render(source, context):
    """-> {"expected": str} or {"error": ExceptionType, "message": str}"""
    try:
        return {"expected": ENV.from_string(source).render(**context)}
    except Exception as e:  # noqa: BLE001 - every exception is an expected outcome to record
        return {"error": type(e).__name__, "message": str(e)}


# ---------------------------------------------------------------------------------------------------------------
# Snippets: (name, template, context)

MSGS = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello", "reasoning_content": "thought"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Météo", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]

S = []


def s(name, template, **ctx):
    S.append((name, template, ctx))


# --- output, literals, whitespace control
s("text", "plain text")
s("var", "{{ x }}", x="v")
s("undefined_prints_empty", "[{{ nope }}]")
s("none_true_false", "{{ none }} {{ true }} {{ false }} {{ None }} {{ True }}")
s("int_float", "{{ 1 }} {{ 1.0 }} {{ 1.5e3 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1_000 }} {{ 0x1F }} {{ 0b11 }} {{ 0o17 }}")
s("float_repr", "{{ 3.0 }} {{ 100.0 / 3 }} {{ 1e15 }} {{ 123456789.125 }} {{ 0.0001 }} {{ -0.0 }} {{ 2.5e-10 }}", )
s("float_ctx", "{{ a }} {{ b }} {{ c }} {{ d }}", a=1.0, b=0.1, c=1e22, d=-2.5)
s("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\"f' }}|{{ \"x\\x41\\u00e9\\U0001F600\\101\" }}|{{ '\\q' }}")
s("string_concat_literals", "{{ 'a' 'b' \"c\" }}")
s("list_repr", "{{ [1, 'a', none, 1.0, true, [2, 'b']] }}")
s("dict_repr", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}")
s("str_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}")
s("repr_unicode", "{{ ['é', '中文', '\\x01', '\\x7f', '\\xa0', '\\u200b', '\\u2028', '😀', '\\n\\t\\\\'] }}")
s("tuple_repr", "{{ (1,) }} {{ () }} {{ (1, 'a') }} {{ 1, 2 }}")
s("ctx_dict_repr", "{{ d }}", d={"k": "v", "n": None, "f": 2.0, "l": [True, False]})
s("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
s("lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}\n")
s("lstrip_not_variable", "x\n  {{ 1 }}")
s("plus_disables", "  {%+ if true %}x{% endif +%}\ny")
s("minus_strips", "a  \n  {%- if true -%}  \n b \n {%- endif -%} \n c")
s("var_minus", "a  {{- 'b' -}}  c")
s("comment", "a{# comment #}b\n{# line #}\nc")
s("comment_ws", "x\n  {# c #}  \nz")
s("comment_minus", "a  {#- c -#}  b")
s("trailing_newline_dropped", "a\n\n")
s("single_trailing_newline", "a\n")
s("crlf", "a\r\nb\rc{% if true %}\r\nd{% endif %}")
s("raw", "{% raw %}{{ x }}{% if %}{% endraw %}")
s("raw_ws", "x\n  {% raw -%}  a  {%- endraw %}\ny")
s("unicode_ws_lstrip", "x\n \u3000{% if true %}y{% endif %}")
s("unicode_ws_minus", "{{ 1 -}} \u3000\u2028x")
s("plus_minus_var_sign", "{{+1}}{{-1}}")
s("multiline_tag", "{{ 'a' ~\n 'b' }}{% if\n true %}c{% endif %}")

# --- operators
s("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
s("arith_float", "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1.5 * 2 }} {{ 10 / 4.0 }} {{ 2.0 ** 0.5 }}")
s("pow_left_assoc", "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ (-2) ** 3 }}")
s("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }} {{ not 1 == 2 }}")
s("bool_arith", "{{ true + 1 }} {{ true * 3 }} {{ [1, 2][true] }}")
s("str_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true }}")
s("list_ops", "{{ [1] + [2, 3] }} {{ [0] * 3 }} {{ (1, 2) + (3,) }}")
s("concat_undefined", "{{ 'x' ~ nope ~ 'y' }}")
s("comparisons", "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' != 'b' }} {{ none == none }} {{ 1 >= 1 }}")
s("eq_containers", "{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1.0} }} {{ (1, 2) == [1, 2] }} {{ nope == nope }}")
s("in_operator", "{{ 'ab' in 'cabd' }} {{ 1 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'x' not in 'abc' }} {{ 3 not in [1] }} {{ 'a' in nope }}")
s("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} {{ [] or {} }}")
s("not", "{{ not none }} {{ not [] }} {{ not 'a' }} {{ not not 1 }}")
s("ternary", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] {{ 'a' if false else 'b' if true else 'c' }}")
s("ternary_undefined_falsy", "{{ 'yes' if nope else 'no' }}")
s("neg_unary", "{{ -x }} {{ +x }} {{ - -3 }}", x=4)
s("neg_filter", "{{ -2|abs }} {{ -x|abs }}", x=5)
s("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0, 0.5] %}{{ 'T' if v else 'F' }}{% endfor %}")

# --- subscript, slicing, attributes
s("index_negative", "{{ l[0] }} {{ l[-1] }} {{ l[-3] }} [{{ l[5] }}]", l=[1, 2, 3])
s("index_string_codepoints", "{{ s[0] }}{{ s[1] }}{{ s[-1] }} {{ s|length }}", s="héllo😀")
s("slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[1:-1] }} {{ l[5:] }} {{ l[3:1:-1] }}", l=[1, 2, 3, 4, 5])
s("string_slices", "{{ s[::-1] }} {{ s[1:3] }} {{ s[-2:] }} {{ s[:0] }}", s="añb😀c")
s("dot_index", "{{ l.0 }} {{ l.1.0 }}", l=[["a"], ["b"]])
s("dict_access", "{{ d.a }} {{ d['a'] }} {{ d['b'] }} [{{ d.missing }}] [{{ d['missing'] }}]", d={"a": 1, "b": 2})
s("attr_before_key", "{{ d.items is defined }} {{ d['items'] }} {{ d.get('items') }}", d={"items": "value"})
s("none_attr", "[{{ none.x }}]")
s("loop_last_msg_wrap", "{% for m in msgs %}{{ msgs[loop.index0 - 1].role }},{% endfor %}", msgs=MSGS)
s("nested_data", "{{ msgs[2].reasoning_content }} {{ msgs[1]['role'] }}", msgs=MSGS)
s("getattr_on_list", "[{{ l.foo }}] {{ l.index(2) }} {{ l.count(1) }}", l=[1, 2, 1])

# --- tests
s("tests_types", "{{ 'a' is string }} {{ 1 is number }} {{ 1.0 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 1.0 is integer }} {{ true is boolean }} {{ none is none }}")
s("tests_defined", "{{ x is defined }} {{ nope is defined }} {{ nope is undefined }} {{ n is defined }} {{ n is none }}", x=1, n=None)
s("tests_containers", "{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ 'a' is iterable }} {{ nope is iterable }} {{ 1 is iterable }} {{ {} is iterable }}")
s("tests_bool", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}")
s("tests_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 3.0 is odd }}")
s("tests_compare", "{{ 2 is eq 2 }} {{ 2 is equalto 3 }} {{ 2 is ne 3 }} {{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 1 is lt 2 }} {{ 2 is le 1 }} {{ 2 is greaterthan 1 }} {{ 1 is lessthan 1 }}")
s("tests_misc", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ 'a' is in 'cat' }} {{ 1 is in [2] }} {{ none is sameas none }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'zzz' is filter }}")
s("tests_callable", "{{ range is callable }} {{ 'a' is callable }} {{ namespace is callable }} {{ x.get is callable }}", x={})
s("is_not", "{{ 1 is not string }} {{ x is not none }} {{ nope is not defined }}", x=1)
s("test_in_filter_chain", "{{ (l|length) is odd }} {{ not l is string }}", l=[1, 2, 3])

# --- filters
s("f_trim", "[{{ '  a b \\n'|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ '\\u3000a\\x1c'|trim }}]")
s("f_tojson", "{{ d|tojson }}", d={"b": 1, "a": [1.0, 2.5, None, True], "s": "é\"\\/<>&\n\t\u2028\x01", "f": 1e-5, "g": 1e16})
s("f_tojson_args", "{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}", d={"z": "é😀", "a": {"x": [1, {}], "y": []}})
s("f_tojson_indent_str", "{{ [1, [2]]|tojson(indent='\\t') }}|{{ {}|tojson(indent=2) }}|{{ []|tojson }}")
s("f_tojson_scalars", "{{ 'a'|tojson }} {{ 1|tojson }} {{ 1.0|tojson }} {{ none|tojson }} {{ true|tojson }} {{ (1, 2)|tojson }} {{ {1: 2, none: 3, true: 4, 1.5: 5}|tojson }}")
s("f_length", "{{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|length }} {{ nope|length }} {{ 'ab'|count }}")
s("f_default", "{{ nope|default('d') }} {{ none|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ x|d('d') }} {{ nope|default }}", x=0)
s("f_case", "{{ 'hello WORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hello big-world (x) o\\'neil'|title }} {{ 'hELLO wORLD'|capitalize }}")
s("f_case_unicode", "{{ 'éa'|upper }} {{ 'ÉA'|lower }} {{ 'éclair-ñu'|title }}")
s("f_join", "{{ [1, 'a', none]|join }} {{ ['a', 'b']|join(', ') }} {{ users|join('/', attribute='name') }} {{ 'abc'|join('-') }}", users=[{"name": "x"}, {"name": "y"}])
s("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 123|replace('2', 'x') }}")
s("f_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ {'a': 1, 'b': 2}|first }} {{ {'a': 1, 'b': 2}|last }} [{{ []|first }}] [{{ []|last }}]")
s("f_map", "{{ users|map(attribute='name')|list }} {{ ['a', 'b']|map('upper')|join }} {{ users|map(attribute='age', default=0)|list }} {{ [1.5, 2.5]|map('round')|list }}", users=[{"name": "x", "age": 3}, {"name": "y"}])
s("f_map_nested_attr", "{{ msgs|map(attribute='role')|join(',') }} {{ l|map(attribute='0')|list }} {{ l|map(attribute='1.a')|list }}", msgs=MSGS, l=[["p", {"a": 1}], ["q", {"a": 2}]])
s("f_select_reject", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 5, 10]|select('gt', 4)|list }} {{ ['a', 'b']|select('in', 'abc')|list }}")
s("f_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('role', 'eq', 'system')|map(attribute='content')|join(',') }} {{ msgs|selectattr('reasoning_content')|list|length }} {{ msgs|selectattr('reasoning_content', 'defined')|map(attribute='role')|first }}", msgs=MSGS)
s("f_selectattr_generator_truthy", "{{ 'T' if []|select else 'F' }} {{ 'T' if []|select|list else 'F' }}")
s("f_list", "{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ (1, 2)|list }} {{ nope|list }}")
s("f_items", "{% for k, v in {'a': 1, 'b': [2]}|items %}{{ k }}={{ v }};{% endfor %} {{ {'x': 1}|items|list }}")
s("f_dictsort", "{{ {'b': 1, 'a': 2, 'C': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }}")
s("f_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}|{{ ''|indent(first=true) }}")
s("f_string_int_float", "{{ 1|string }} {{ [1]|string }} {{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '1_000'|int }} {{ ' 12 '|int }} {{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ true|int }} {{ none|int }}")
s("f_round", "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1.23456|round(3) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} {{ 5|round }} {{ 15|round(-1) }} {{ 25|round(-1) }} {{ 1234.5|round(-2) }} {{ -2.5|round }}")
s("f_sort", "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a', 'C']|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join }} {{ users|sort(attribute='g,age')|map(attribute='name')|join }}", users=[{"name": "x", "age": 3, "g": 1}, {"name": "y", "age": 1, "g": 1}, {"name": "z", "age": 2, "g": 0}])
s("f_unique", "{{ [1, 2, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ ['a', 'A', 'b']|unique(case_sensitive=true)|list }} {{ users|unique(attribute='g')|map(attribute='n')|list }}", users=[{"n": 1, "g": "a"}, {"n": 2, "g": "a"}, {"n": 3, "g": "b"}])
s("f_min_max_sum", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ users|sum(attribute='a') }} {{ [[1], [2]]|sum(start=[]) }} [{{ []|max }}]", users=[{"a": 1}, {"a": 5}])
s("f_reverse", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ 'añ😀'|reverse }}")
s("f_abs", "{{ -3|abs }} {{ (-2.5)|abs }} {{ x|abs }}", x=-7)
s("f_center_truncate", "[{{ 'ab'|center(7) }}] [{{ 'abc'|center(6) }}] {{ 'Hello wonderful world of tests'|truncate(12) }} {{ 'Hello wonderful world'|truncate(9, true) }} {{ 'short'|truncate(3, leeway=10) }} {{ 'Hello world'|truncate(8, end='~') }}")
s("f_wordcount", "{{ 'hello world, foo_bar 42'|wordcount }} {{ ''|wordcount }}")
s("f_format", "{{ '%s-%d'|format('a', 3) }} {{ '%(x)s!'|format(x='y') }} {{ '%5.2f|%-4s|%04d'|format(3.14159, 'ab', 7) }}")
s("f_batch_slice", "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} {{ [1, 2, 3, 4, 5]|slice(2)|list }} {{ [1, 2, 3, 4]|slice(3, 0)|list }}")
s("f_groupby", "{% for g in users|groupby('city') %}{{ g.grouper }}:{{ g.list|map(attribute='n')|join(',') }};{% endfor %} {% for city, items in users|groupby('city') %}{{ city }}={{ items|length }} {% endfor %}", users=[{"n": "a", "city": "X"}, {"n": "b", "city": "Y"}, {"n": "c", "city": "x"}])
s("f_escape", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }}")
s("f_safe_string", "{{ 5|safe }} {{ none|string }} {{ nope|string }}")
s("f_attr", "{{ d|attr('items') is defined }} [{{ d|attr('a') }}]", d={"a": 1})
s("f_urlencode", "{{ 'a b/c&d'|urlencode }} {{ {'k': 'v w', 'x': 1}|urlencode }}")
s("f_filesizeformat", "{{ 100|filesizeformat }} {{ 1000000|filesizeformat }} {{ 1|filesizeformat }} {{ 2048|filesizeformat(true) }}")
s("f_pprint_short", "{{ {'a': [1, 2]}|pprint }}")
s("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter trim|replace('a', 'b') %}  aaa  {% endfilter %}")

# --- string methods
s("m_strip", "[{{ '  a  '.strip() }}] [{{ '  a  '.lstrip() }}] [{{ '  a  '.rstrip() }}] [{{ 'xyaxy'.strip('xy') }}] [{{ '\\n\\na\\n'.rstrip('\\n') }}] [{{ '\\u2028a\\x1f'.strip() }}]")
s("m_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ '  a b '.split(None, 1) }} {{ 'a</think>b</think>c'.split('</think>') }} {{ 'abc'.split('x') }} {{ ''.split() }} {{ ''.split(',') }}")
s("m_rsplit", "{{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b c '.rsplit(None, 1) }} {{ 'a b'.rsplit() }}")
s("m_split_index", "{{ 'x</think>y'.split('</think>')[-1] }} {{ 'x</think>y</think>z'.split('</think>', 1)[1] }}")
s("m_startswith", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('l', 0, 3) }} {{ 'hello'.startswith('l', 2) }} {{ ''.startswith('') }}")
s("m_replace_case", "{{ 'aXa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }} {{ 'AbC'.swapcase() }}")
s("m_find_count", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'hello'.count('l') }} {{ 'hello'.index('e') }} {{ 'aaa'.count('') }} {{ 'hello'.find('l', 3) }}")
s("m_join_pad", "{{ ', '.join(['a', 'b']) }} {{ '-'.join('abc') }} [{{ 'ab'.center(6, '*') }}] [{{ 'ab'.ljust(4) }}] [{{ 'ab'.rjust(4, '.') }}] {{ '42'.zfill(5) }} {{ '-42'.zfill(5) }}")
s("m_predicates", "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' \\t'.isspace() }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} {{ 'Ab Cd'.istitle() }} {{ ''.isdigit() }} {{ 'ab_1'.isidentifier() }}")
s("m_partition", "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }} {{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }}")
s("m_splitlines", "{{ 'a\\nb\\r\\nc\\rd'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }}")
s("m_format", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^7}|'.format('a', 'b', 'c') }} {{ '{:.2f} {:5d} {:,} {:x} {:08.3f}'.format(3.14159, 42, 1234567, 255, -3.5) }} {{ '{{}} {0[a]} {0[b][0]}'.format({'a': 1, 'b': [2]}) }} {{ '{!r} {:.3}'.format('q', 2.0) }}")
s("m_format_misc", "{{ '{:+d} {: d} {:e} {:g} {:%}'.format(5, 5, 12345.678, 0.0001, 0.25) }} {{ '{}'.format(none) }} {{ '{}'.format([1, 'a']) }} {{ '{:*^9}'.format('mid') }}")
s("percent_format", "{{ '%s=%r' % ('k', 'v') }} {{ '%d%%' % 50 }} {{ '%.3f' % 2.5 }} {{ '%5s|%-5s|' % ('a', 'b') }} {{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }} {{ '%x %o %e' % (255, 8, 1500.0) }}")

# --- dict methods
s("d_methods", "{{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.items()|length }}", d={"a": 1, "b": "x"})
s("d_views_repr", "{{ d.items() }} {{ d.keys() }} {{ d.values() }}", d={"a": 1})
s("d_in_and_len", "{{ 'a' in d }} {{ 'z' in d }} {{ d|length }} {{ d.copy() }}", d={"a": 1})
s("dict_literal_dup", "{{ {'a': 1, 'a': 2, 'b': 3} }} {{ {1: 'x', 1.0: 'y', true: 'z'} }}")
s("dict_int_keys_lookup", "{{ d[1] }} {{ d[1.0] }} {{ d[true] }}", d={"1": "str"})

# --- statements
s("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %} {% endfor %}")
s("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}")
s("for_prev_next", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}")
s("for_cycle_changed", "{% for i in range(5) %}{{ loop.cycle('a', 'b') }}{{ loop.changed(i // 2) }} {% endfor %}")
s("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}")
s("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ '/' ~ loop.length if loop.last }},{% endfor %}")
s("for_unpack", "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }} {% endfor %}{% for k, v in {'x': 1}.items() %}{{ k }}{{ v }}{% endfor %}")
s("for_dict", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}")
s("for_string", "{% for c in 'héllo' %}{{ c }}.{% endfor %}")
s("for_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}")
s("for_nested_loop", "{% for i in [1, 2] %}{% for j in 'ab' %}{{ i }}{{ j }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}")
s("for_recursive", "{% for n in tree recursive %}{{ n.name }}{% if n.children %}({{ loop(n.children) }}){% endif %}{{ loop.depth }}{% endfor %}", tree=[{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c"}]}, {"name": "d"}])
s("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}")
s("loop_scope_no_leak", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]")
s("loop_var_after", "{% set x = 5 %}{% for x in [1, 2] %}{% endfor %}{{ x }}|{% for z in [1] %}{% endfor %}[{{ z }}]")
s("if_set_leaks", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}")
s("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} [{{ ns.missing }}]")
s("namespace_init", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {{ ns }}")
s("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}")
s("set_block", "{% set s %}a{{ 1 }}\nb{% endset %}[{{ s }}]{% set t | upper %}xy{% endset %}{{ t }}")
s("set_expr_tuple", "{% set t = 1, 2 %}{{ t }}")
s("macro_basic", "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='y') }} {{ m(a=5) }}")
s("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}")
s("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}")
s("macro_sees_globals", "{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ m() }}")
s("macro_not_caller_scope", "{% macro m() %}[{{ x }}]{% endmacro %}{% for x in [5] %}{{ m() }}{% endfor %}")
s("macro_in_loop", "{% for x in [5, 6] %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% endfor %}")
s("macro_result_string", "{% macro m() %}  Hi  {% endmacro %}[{{ m().strip() }}] {{ m()|length }} {{ m() is string }}")
s("macro_default_refers_arg", "{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(3) }}")
s("macro_recursion", "{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1)|int }}{% endmacro %}{{ fact(5) }}")
s("macro_repr", "{% macro m() %}{% endmacro %}{{ m }}")
s("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}")
s("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}")
s("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]")
s("print_tag", "{% print 'a', 1 %}")
s("generation_tag", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}", msgs=MSGS)
s("block_tag", "{% block b %}B{{ 1 }}{% endblock %}")

# --- globals
s("range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3) }} {{ range(1, 5, 2) }}")
s("dict_global", "{{ dict(a=1, b='x') }} {{ dict({'c': 1}, d=2) }}")
s("joiner_cycler", "{% set j = joiner('|') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %} {% set c = cycler('x', 'y') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}")
s("raise_exception_unused", "{% if false %}{{ raise_exception('no') }}{% endif %}ok")
s("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }} {{ strftime_now('%A %B %-d %j %p %I %y') }}")
s("loop_outside", "[{{ loop }}]")

# --- the chat-template idioms of real templates
s("idiom_last_user", "{% set ns = namespace(idx=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}", msgs=MSGS)
s("idiom_tools_json", "{% for t in tools %}{{ t | tojson }}\n{% endfor %}", tools=TOOLS)
s("idiom_content_parts", "{% for p in content %}{% if p is mapping and p.type == 'text' %}{{ p.text }}{% elif p is string %}{{ p }}{% endif %}{% endfor %}", content=[{"type": "text", "text": "a"}, "b", {"type": "image"}])
s("idiom_think_split", "{% set c = content %}{% if '</think>' in c %}{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}{% endif %}", content="<think>\nreason\n</think>\n\nanswer")
s("idiom_default_kwarg", "{{ enable_thinking is defined }} {{ (enable_thinking is defined and not enable_thinking) }}", enable_thinking=None)
s("idiom_json_args", "{{ args if args is string else args|tojson }}", args={"q": "x", "n": [1, 2.0]})
s("idiom_user_template_text", "{{ m }}", m="{{ x }} {% if %} <|user|>")
s("idiom_bos", "{{ bos_token }}{{ messages|length }}", bos_token="<s>", messages=[])
s("idiom_loop_index_wrap", "{% for m in msgs %}{% if loop.first or msgs[loop.index0 - 1].role != 'tool' %}H{% endif %}{{ m.role[0] }}{% endfor %}", msgs=[{"role": "tool"}, {"role": "tool"}, {"role": "user"}, {"role": "tool"}])
s("idiom_int_float_json", "{{ d|tojson }} {{ d.i }} {{ d.f }}", d={"i": 1, "f": 1.0, "big": 12345678901234, "neg": -0.5})

# --- errors (jinja2 raises; so must we)
s("err_undefined_attr", "{{ nope.x }}")
s("err_undefined_add", "{{ nope + 1 }}")
s("err_str_plus_undefined", "{{ 'x' + nope }}")
s("err_str_plus_int", "{{ 'a' + 1 }}")
s("err_str_plus_dict", "{{ 'a' + {} }}")
s("err_int_plus_str", "{{ 1 + 'a' }}")
s("err_list_append", "{% set l = [] %}{% set _ = l.append(1) %}")
s("err_dict_update", "{% set d = {} %}{{ d.update({'a': 1}) }}")
s("err_unsafe_attr_unused_ok", "{% set l = [1] %}[{{ l.append }}]")
s("err_raise_exception", "{{ raise_exception('Conversation roles must alternate') }}")
s("err_unknown_filter", "{{ 1|nosuchfilter }}")
s("err_unknown_filter_in_if_ok", "{% if false %}{{ 1|nosuchfilter }}{% endif %}ok")
s("err_unknown_filter_in_if_runtime", "{% if true %}{{ 1|nosuchfilter }}{% endif %}")
s("err_unknown_filter_in_for", "{% if false %}{% for i in [] %}{{ i|nosuchfilter }}{% endfor %}{% endif %}")
s("err_unknown_test", "{{ 1 is nosuchtest }}")
s("err_unknown_test_in_if", "{% if 1 is nosuchtest %}{% endif %}")
s("err_unknown_tag", "{% do x %}")
s("err_syntax_unclosed", "{% if true %}x")
s("err_syntax_endfor", "{% for x in y %}{% endif %}")
s("err_syntax_expr", "{{ 1 + }}")
s("err_syntax_empty", "{{ }}")
s("err_unclosed_comment", "a {# b")
s("err_unclosed_string", "{{ 'abc }}")
s("err_break_outside", "{% break %}")
s("err_div_zero", "{{ 1 / 0 }}")
s("err_mod_zero", "{{ 1 % 0 }}")
s("err_iter_none", "{% for x in none %}{% endfor %}")
s("err_iter_int", "{% for x in 5 %}{% endfor %}")
s("err_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
s("err_len_none", "{{ none|length }}")
s("err_in_string_int", "{{ 1 in 'abc' }}")
s("err_compare_types", "{{ 1 < 'a' }}")
s("err_sort_mixed", "{{ [1, 'a']|sort }}")
s("err_ns_assign", "{% set x = 1 %}{% set x.a = 1 %}")
s("err_macro_too_many", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}")
s("err_macro_bad_kw", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}")
s("err_call_string", "{{ 'abc'() }}")
s("err_call_undefined", "{{ nope() }}")
s("err_str_method_on_undefined", "{{ nope.strip() }}")
s("err_split_empty_sep", "{{ 'a'.split('') }}")
s("err_index_not_found", "{{ 'abc'.index('z') }}")
s("err_tojson_undefined", "{{ nope|tojson }}")
s("err_items_on_str", "{% for k, v in 'ab'.items() %}{% endfor %}")
s("err_range_too_big", "{{ range(1000000)|length }}")
s("err_dunder", "{{ ''.__class__ }}")
s("err_dunder_call", "{{ ''.__class__() }}")
s("err_unhashable_key", "{{ {[1]: 2} }}")
s("err_items_filter_non_mapping", "{{ [1]|items|list }}")
s("err_slice_step_zero", "{{ [1, 2][::0] }}")
s("err_assign_const", "{% set true = 1 %}")
s("err_indent_int", "{{ 5|indent }}")
s("err_chained_is", "{{ 1 is number is number }}")


# --- more edge cases
s("fmt_spec_more", "{{ '{:,.2f}'.format(1234567.891) }} {{ '{:>{w}}'.format('a', w=5) }} {{ '{0:b}'.format(5) }} {{ '{:#x}'.format(255) }} {{ '{:010.3f}'.format(-3.14159) }} {{ '{:_}'.format(1000000) }} {{ '{:.0f}'.format(2.5) }} {{ '{:5}|{:<5}|'.format(1, 2) }}")
s("percent_more", "{{ '%c%c' % (65, 'b') }} {{ '%5.1f%%' % 12.345 }} {{ '%+d %+d' % (5, -5) }} {{ '%r' % 'x' }} {{ '%s' % [1] }} {{ '%s' % none }} {{ '%-6.2f|' % 1.0 }} {{ '%05.1f' % -2.25 }} {{ '%.2s' % 'abc' }} {{ '%i' % 3.9 }}")
s("err_percent_args", "{{ '%s %s' % ('a',) }}")
s("err_percent_extra", "{{ '%s' % ('a', 'b') }}")
s("seq_repeat_edge", "[{{ 'abc' * 0 }}] {{ [1] * -1 }} {{ 'ab' * true }}")
s("float_repr_more", "{{ 1/3 }} {{ 2/3 }} {{ 1e100 }} {{ 1.7976931348623157e308 }} {{ 5e-324 }} {{ 123456789012345678.0 }} {{ 0.000123 }} {{ 1e-4 }} {{ 12345678901234567.0 }} {{ 9007199254740993.0 }}")
s("mod_div_signs", "{{ 10 // 3.0 }} {{ -1 % 5.0 }} {{ 5 % -3 }} {{ -5 // 3 }} {{ 5.0 % -3 }} {{ -0.0 % 5 }} {{ 7 // -2 }} {{ 3 ** 0 }} {{ 0 ** 0 }} {{ 2 ** 62 }}")
s("round_more", "{{ 1250.0|round(-2) }} {{ 1350.0|round(-2) }} {{ 0.5|round }} {{ 1.5|round }} {{ 1.005|round(2) }} {{ 2.5|round(0, 'ceil') }} {{ -2.5|round(0, 'floor') }} {{ 0.125|round(2) }} {{ 35|round(-1) }} {{ -25|round(-1) }} {{ 1.0|round(1) }}")
s("default_none_arg", "[{{ nope|default(none) }}] {{ nope|default(false) }} {{ nope|default([]) }}")
s("ws_combo", "{%- if true -%}\n\n  A  \n{%- endif -%}\n\n{% for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}\n\t{# tab comment #}\nend")
s("ws_lstrip_tabs", "a\n\t \t{% if true %}b{% endif %}\n\t{{ 'c' }}")
s("ws_raw_minus", "a  {%- raw %} x {% endraw -%}  b")
s("ws_comment_first_line", "{# first #}\nx")
s("ws_block_at_eof", "x\n{% if true %}\n{% endif %}\n")
s("nested_macros", "{% macro outer(x) %}{% macro inner(y) %}<{{ x }}{{ y }}>{% endmacro %}{{ inner(1) }}{{ inner(2) }}{% endmacro %}{{ outer('a') }}")
s("caller_args_varargs", "{% macro m() %}{{ caller(1, 2) }}|{{ varargs }}{% endmacro %}{% call(a, b) m(7, 8) %}{{ a + b }}{% endcall %}")
s("macro_caller_undefined", "{% macro m() %}[{{ caller is defined }}]{% endmacro %}{{ m() }}")
s("recursive_depth", "{% for n in t recursive %}{{ loop.depth }}{{ loop.depth0 }}{% if n.c %}[{{ loop(n.c) }}]{% endif %}{% endfor %}", t=[{"c": [{"c": [{}]}]}, {}])
s("err_ns_undefined_assign", "{% set nope.a = 1 %}")
s("unicode_compare", "{{ 'é' > 'z' }} {{ 'a' in ['a'] }} {{ ['a'] in [['a']] }} {{ 'Z' < 'a' }} {{ '😀' > 'é' }}")
s("err_list_plus_tuple", "{{ [1] + (2,) }}")
s("sameas_more", "{{ 1 is sameas 1 }} {{ [] is sameas [] }} {{ false is sameas false }} {{ 0 is sameas false }}")
s("filter_chains", "{{ {'a': 1}|dictsort|first }} {{ 'Hello'|list|sort|join }} {{ [3, 1]|sort|first }} {{ 'x'|center(1) }} {{ d.items()|list }} {{ (d|dictsort)[0][1] }}", d={"b": 2, "a": 1})
s("nested_unpack", "{% for a, (b, c) in [[1, [2, 3]]] %}{{ a }}{{ b }}{{ c }}{% endfor %} {% set x, y = 'xy' %}{{ y }}{{ x }}")
s("select_in_list", "{{ msgs|selectattr('role', 'in', ['user', 'system'])|list|length }} {{ 'tool' ~ (1 + 1) }} {% if not msgs %}empty{% else %}full{% endif %}", msgs=MSGS)
s("braces_in_strings", "{{ '}}' }}{{ '{{' }}{{ '%}' }}{% if '%}' %}x{% endif %}{{ {'a': '}}'}['a'] }}")
s("string_newline_escape", "{{ '\\n' == '\n' }} {{ 'a\\\nb' }} {{ \"\\\"\" }}")
s("err_bad_escape", "{{ '\\x4' }}")
s("keyword_names", "{% set in_ = 1 %}{% set if_ = 2 %}{{ in_ + if_ }} {{ d.if }} {{ d.in }} {{ d.not }}", d={"if": 1, "in": 2, "not": 3})
s("loop_length_filter_else", "{% for x in [1, 2, 3] if x > 5 %}{{ x }}{% else %}none>5{% endfor %}")
s("loop_changed_multi", "{% for a, b in [[1, 1], [1, 2], [1, 2], [2, 2]] %}{{ loop.changed(a, b) }} {% endfor %}")
s("tojson_nested_unicode_keys", "{{ {'ключ': 'значение', 'emoji😀': ['\\u0000', '\\x1f', '\\x7f', '\\u0085']}|tojson }}")
s("tojson_list_of_tuples", "{{ {'a': 1}.items()|list|tojson }}")
s("err_tojson_generator", "{{ [1]|map('string')|tojson }}")
s("items_order_preserved", "{% for k, v in d.items() %}{{ k }}{% endfor %} {{ d|tojson }}", d={"z": 1, "a": 2, "m": 3})
s("map_filter_args", "{{ ['a b', 'c d']|map('replace', ' ', '_')|list }} {{ [1, 2]|map('string')|join('+') }} {{ [' a ']|map('trim')|first }}")
s("select_test_args", "{{ [1, 2, 3, 4, 6]|select('divisibleby', 3)|list }} {{ ['a', 1, none]|reject('string')|list }} {{ [none, 1]|select('none')|list }}")
s("selectattr_nested", "{{ items|selectattr('a.b', 'equalto', 1)|list|length }} {{ items|map(attribute='a.b')|list }}", items=[{"a": {"b": 1}}, {"a": {"b": 2}}, {"a": {}}])
s("str_method_chains", "{{ '  Hello World  '.strip().lower().replace('world', 'there').split(' ') }}")
s("str_methods_unicode", "{{ 'ÀÉÎ'.lower() }} {{ 'straße'.upper() }} {{ 'ǅ'.lower() }} {{ 'éa'.title() }} {{ 'ß'.capitalize() }}")
s("lstrip_rstrip_chars", "{{ '<think>\\nx\\n</think>'.lstrip('<think>') }} {{ 'aaa.txt'.rstrip('.txt') }}")
s("split_maxsplit_zero", "{{ 'a b c'.split(' ', 0) }} {{ 'a b c'.split(maxsplit=1) }} {{ 'a,b'.split(sep=',') }}")
s("count_and_len_generators", "{{ [1, 2]|select|list|length }} {{ range(3)|length }} {{ range(10)[2] }} {{ range(10)[-1] }}")
s("err_length_generator", "{{ [1, 2]|select|length }}")
s("err_index_generator", "{{ ([1]|select)[0].x }}")
s("int_keys_dict_literal", "{{ {1: 'a'}[1] }} {{ {1: 'a'}[1.0] }} {{ {1: 'a'}[true] }} {{ {none: 'n'}[none] }}")
s("concat_precedence", "{{ 1 ~ 2 + 3 }}|{{ 'a' ~ 'b' if false else 'c' }}")
s("is_test_args_primary", "{{ 10 is divisibleby 2 and true }} {{ x is sameas none or 1 }}", x=None)
s("undefined_ops_ok", "{{ nope is none }} {{ nope|length }} {{ nope|list }} {{ nope == nope }} {{ nope != 1 }} {% for x in nope %}x{% endfor %}[{{ nope|join }}] {{ nope in [] }}")
s("err_undefined_compare", "{{ nope < 1 }}")
s("err_undefined_iter_attr", "{% for x in nope.items() %}{% endfor %}")
s("err_undefined_index", "{{ nope[0] }}")
s("err_deep_undefined", "{{ d.a.b.c }}", d={"a": {}})
s("err_neg_str", "{{ -'a' }}")
s("err_float_mod_zero", "{{ 1.5 % 0 }}")
s("err_float_floordiv_zero", "{{ 1.5 // 0.0 }}")
s("err_pow_zero_negative", "{{ 0.0 ** -1 }}")
s("generator_single_pass", "{% set g = [1, 2]|select %}{{ g|list }}{{ g|list }}")
s("reverse_generator_print", "{{ [1, 2, 3]|reverse|join(',') }} {{ 'abc'|reverse|upper }}")
s("with_scoping", "{% set a = 1 %}{% with a = a + 1, b = a %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}{{ a }}[{{ c }}]")
s("set_block_scope", "{% set x = 1 %}{% set s %}{% set x = 2 %}{{ x }}{% endset %}{{ s }}{{ x }}")
s("filter_block_scope", "{% set x = 1 %}{% filter upper %}{% set x = 2 %}a{{ x }}{% endfilter %}{{ x }}")
s("macro_kwargs_only", "{% macro m() %}{{ kwargs|dictsort }}{% endmacro %}{{ m(b=1, a=2) }}")
s("macro_call_positional_kw_mix", "{% macro m(a, b, c=3) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1, c=5, b=2) }}")
s("err_macro_dup_arg", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}")
s("call_macro_in_expression", "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) ~ m(2) }} {{ [m(3)]|join }} {{ m(4) + '!' }}")
s("namespace_in_macro", "{% set ns = namespace(v=[]) %}{% macro add(x) %}{% set ns.v = ns.v + [x] %}{% endmacro %}{{ add(1) }}{{ add(2) }}{{ ns.v }}")
s("namespace_attr_chain", "{% set ns = namespace(d={'a': {'b': 1}}) %}{{ ns.d.a.b }} {{ ns['d'] }}")
s("loop_in_macro_break", "{% macro m() %}{% for i in range(5) %}{% if i > 1 %}{% break %}{% endif %}{{ i }}{% endfor %}{% endmacro %}{{ m() }}")
s("long_output", "{% for i in range(300) %}{{ i }},{% endfor %}")
s("strftime_more", "{{ strftime_now('%Y') }} [{{ strftime_now('%z%Z') }}] {{ strftime_now('%H:%M') }} {{ strftime_now('%%') }}")
s("raise_in_macro", "{% macro check(r) %}{% if r not in ['user', 'assistant'] %}{{ raise_exception('bad role ' ~ r) }}{% endif %}{% endmacro %}{{ check('user') }}ok")
s("err_raise_in_loop", "{% for m in msgs %}{% if m.role == 'assistant' %}{{ raise_exception('no assistant: ' ~ loop.index) }}{% endif %}{% endfor %}", msgs=MSGS)

s("undefined_filters_ok", "{{ nope|truncate }}|{{ nope|format }}|{{ nope|sum }}|{{ nope|sort }}|{{ nope|batch(2)|list }}|{{ nope|slice(2)|list }}|{{ nope|groupby('a') }}|{{ nope|center(5) }}|{{ nope|urlencode }}|{{ nope|wordcount }}|{{ nope|pprint }}|{{ nope|upper }}|{{ nope|replace('a', 'b') }}")
s("err_undefined_int", "{{ nope|int }}")
s("err_undefined_float", "{{ nope|float }}")
s("err_undefined_round", "{{ nope|round }}")
s("err_undefined_abs", "{{ nope|abs }}")
s("err_undefined_dictsort", "{{ nope|dictsort }}")
s("err_undefined_attr_filter", "{{ nope|attr('x') }}")
s("percent_subscriptable_args", "{{ 'a' % [] }}{{ 'a' % {} }}{{ 'a%s' % [1] }}{{ 'a' % range(2) }}")
s("err_percent_unused_str", "{{ 'a' % 'b' }}")
s("percent_star", "[{{ '%*d' % (5, 42) }}] [{{ '%-*s' % (4, 'a') }}] [{{ '%.*f' % (2, 3.14159) }}] [{{ '%*s' % (-4, 'b') }}]")
s("err_percent_star_not_int", "{{ '%**' % ('b') }}")
s("const_slice_folding", "[{{ (1)[1:] }}] [{{ (none)[:2]|sum }}] {{ [(true)[:1], 1] }} {{ (1 if (0)[1:] else 2) }}")
s("err_runtime_slice_int", "{{ n[1:] }}", n=5)
s("err_set_slice_const", "{% set v = (1)[1:] %}")
s("truncate_non_string", "{{ [1, 2]|truncate }} {{ nope|truncate is undefined }}")
s("err_truncate_int", "{{ 5|truncate }}")

# ---------------------------------------------------------------------------------------------------------------
# Chat templates x conversations

TEMPLATES = {
    # file under tests/data/jinja -> (special tokens, list of kwargs variants)
    "templates/glm_4_5.jinja": (
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        [{}, {"enable_thinking": False}, {"enable_thinking": True}],
    ),
    "glm5.jinja": (
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        [{}, {"enable_thinking": False}, {"enable_thinking": None}, {"clear_thinking": False}],
    ),
    "templates/deepseek-ai-DeepSeek-V3.1.jinja": (
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        [{}, {"thinking": True}, {"enable_thinking": True}],
    ),
    "templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        [{}],
    ),
    "templates/DeepSeek-V3.2.jinja": (
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        [{}, {"enable_thinking": False}],
    ),
}

CHAT_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city — météo, 天气 😀",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\" or 'Zürich' \\ </tool_call>\u2028"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "ratio": {"type": "number", "default": 0.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "object", "properties": {
                "field": {"type": "string"}, "values": {"type": "array", "items": {"type": "string"}}}}}},
            "required": ["query"]}}},
]


def call(name, args, as_string, cid="call_1"):
    a = json.dumps(args, ensure_ascii=False) if as_string else args
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": a}}


def tool_conv(as_string):
    return [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris for 3 days?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [call("get_weather", {"city": "Paris", "days": 3, "ratio": 1.0, "opts": {"a": [1, "b"]}}, as_string)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5°C and clear."},
        {"role": "user", "content": "Thanks!"},
    ]


CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_user": {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "  Why did the chicken cross the road?  "},
        {"role": "user", "content": "Another one"}]},
    "reasoning_history": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add two and two.\n"},
        {"role": "user", "content": "times 3?"}]},
    "reasoning_last": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "  Add two and two.  "}]},
    "inline_think": {"messages": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nfirst thoughts\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>more</think>A2"}]},
    "tools_defined": {"messages": [{"role": "user", "content": "What's the weather in Zürich?"}], "tools": CHAT_TOOLS},
    "tool_call_object_args": {"messages": tool_conv(False), "tools": CHAT_TOOLS},
    "tool_call_string_args": {"messages": tool_conv(True), "tools": CHAT_TOOLS},
    "parallel_calls": {"messages": [
        {"role": "user", "content": "Weather in Paris and Rome"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("get_weather", {"city": "Paris"}, False, "c1"), call("get_weather", {"city": "Rome", "days": 2}, False, "c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rainy"}], "tools": CHAT_TOOLS},
    "parallel_calls_string_args": {"messages": [
        {"role": "user", "content": "Weather in Paris and Rome"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("get_weather", {"city": "Paris"}, True, "c1"), call("get_weather", {"city": "Rome", "days": 2}, True, "c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
        {"role": "assistant", "content": "Paris sunny, Rome rainy."}], "tools": CHAT_TOOLS},
    "content_parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "sys part"}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "what?"}]}]},
    "tool_list_content": {"messages": [
        {"role": "user", "content": "run"},
        {"role": "assistant", "content": "ok", "tool_calls": [call("search", {"query": "q"}, False)]},
        {"role": "tool", "content": [{"output": "result one"}, {"type": "text", "text": "raw"}]}]},
    "special_text": {"messages": [
        {"role": "system", "content": "Rules: {{ not a variable }} {% if x %}"},
        {"role": "user", "content": "Say <|user|> and <｜User｜> and </think> and [gMASK] literally: {{ x }} {# c #}"}]},
    "unicode_and_escapes": {"messages": [
        {"role": "user", "content": "中文 日本語 한국어 😀👍🏽 \u2028 line\nbreak \t tab \\ backslash \"quotes\" 'single'"},
        {"role": "assistant", "content": "Ответ: ✓"},
        {"role": "user", "content": "  trailing spaces  \n"}]},
    "empty_and_null_content": {"messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"}]},
    "developer_role": {"messages": [
        {"role": "developer", "content": "Follow the rules."},
        {"role": "user", "content": "Hi"}]},
    "system_only": {"messages": [{"role": "system", "content": "Only a system prompt."}]},
    "two_system": {"messages": [{"role": "system", "content": "First."}, {"role": "system", "content": "Second."},
                                {"role": "user", "content": "Hi"}]},
    "tools_empty_list": {"messages": [{"role": "user", "content": "No tools here"}], "tools": []},
    "tools_in_message": {"messages": [
        {"role": "system", "content": "Tools ride on the message.", "tools": CHAT_TOOLS[:1]},
        {"role": "user", "content": "Weather?"}]},
    "prefix_assistant": {"messages": [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn leaves", "prefix": True}]},
}


def chat_context(special, conv, add_generation_prompt, kwargs):
    ctx = dict(special)
    ctx.update(kwargs)
    ctx["messages"] = conv["messages"]
    ctx["tools"] = conv.get("tools")
    ctx["documents"] = None
    ctx["add_generation_prompt"] = add_generation_prompt
    return ctx


# ---------------------------------------------------------------------------------------------------------------


def header(kind):
    return {"kind": "header", "fixture": kind, "generator": "tools/gen_jinja_fixtures.py",
            "jinja2": jinja2.__version__, "python": platform.python_version(),
            "fixed_now": FIXED_NOW.isoformat()}


def line(obj):
    return json.dumps(obj, ensure_ascii=True, sort_keys=False) + "\n"


def gen_snippets():
    out = [line(header("snippets"))]
    names = set()
    for name, template, ctx in S:
        assert name not in names, name
        names.add(name)
        rec = {"kind": "snippet", "name": name, "template": template, "context": ctx}
        rec.update(render(template, ctx))
        out.append(line(rec))
    return "".join(out), len(S)


def gen_chat():
    out = [line(header("chat_templates"))]
    for path in sorted(TEMPLATES):
        with open(os.path.join(DATA, path), "rb") as f:
            raw = f.read()
        out.append(line({"kind": "template", "file": path, "sha256": hashlib.sha256(raw).hexdigest(),
                         "special_tokens": TEMPLATES[path][0]}))
    for name, conv in CONVERSATIONS.items():
        out.append(line({"kind": "conversation", "name": name, "messages": conv["messages"],
                         "tools": conv.get("tools")}))
    n = 0
    for path in sorted(TEMPLATES):
        special, variants = TEMPLATES[path]
        with open(os.path.join(DATA, path), encoding="utf-8") as f:  # text mode, as transformers reads it
            source = f.read()
        for cname, conv in CONVERSATIONS.items():
            for kwargs in variants:
                for agp in (True, False):
                    rec = {"kind": "case", "template": path, "conversation": cname, "add_generation_prompt": agp,
                           "kwargs": kwargs}
                    rec.update(render(source, chat_context(special, conv, agp, kwargs)))
                    out.append(line(rec))
                    n += 1
    return "".join(out), n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the committed fixtures differ")
    args = ap.parse_args()
    results = {"snippets.jsonl": gen_snippets(), "chat_templates.jsonl": gen_chat()}
    status = 0
    for fname, (text, count) in results.items():
        path = os.path.join(DATA, fname)
        if args.check:
            with open(path, encoding="utf-8") as f:
                if f.read() != text:
                    print(f"{path}: differs from a fresh generation", file=sys.stderr)
                    status = 1
        else:
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
        print(f"{fname}: {count} records", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
