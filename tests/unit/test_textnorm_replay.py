"""Replayed neighbours of the kinds of issues #11, #32 and #43 that still read wrong: units
beside units and medical or cooking units, angles, feet and inches, powers and functions in a
formula, codes after identifier words, 两 where no count is said, English abbreviations before
a number, video resolutions, mixed numbers, years after a quarter or in brackets, am/pm ranges
and a dot before a name. Each case is read with and without WeTextProcessing."""

from __future__ import annotations

import pytest

from chattts_serving.text.normalize import normalize
from tests.support.readings import assert_read

# A unit glued to a number says nothing of the language around it: the second operand of a spec or a size stays
# Chinese.
UNITS_BESIDE_UNITS = [
    ('内存12GB+256GB。', '内存十二GB加二百五十六GB。'),
    ('8+128G版本。', '八加一百二十八G版本。'),
    ('2m×3m的地毯。', '两米乘以三米的地毯。'),
    ('长宽高为10×20×30cm。', '长宽高为十乘以二十乘以三十厘米。'),
    ('电池5000mAh和65W快充。', '电池五千毫安时和六十五瓦快充。'),
    ('30cm×40cm', 'thirty centimeters times forty centimeters'),
    ('He weighs 80kg and is 1.8m tall.', 'He weighs eighty kilograms and is one point eight meters tall.'),
]

# Medical, consumption, cooking and shorthand units, in both languages.
MORE_UNITS = [
    ('血糖6.1mmol/L，肌酐80μmol/L。', '血糖六点一毫摩尔每升，肌酐八十微摩尔每升。'),
    ('空腹血糖126mg/dL。', '空腹血糖一百二十六毫克每分升。'),
    ('油耗6.5L/100km。', '油耗六点五升每百公里。'),
    ('The car gets 30 mpg.', 'The car gets thirty miles per gallon.'),
    ('每天摄入2000kcal。', '每天摄入两千千卡。'),
    ('Add 2 tbsp of sugar and 1 tsp of salt.', 'Add two tablespoons of sugar and one teaspoon of salt.'),
    ('It takes 30 mins.', 'It takes thirty minutes.'),
    ('wait 5 secs', 'wait five seconds'),
    ('He scored 25 pts.', 'He scored twenty five points.'),
    ('There are 7.8bn people.', 'There are seven point eight billion people.'),
    ('Stream in 1080p at 60fps.', 'Stream in ten eighty p at sixty frames per second.'),
    ("That's 50¢.", 'Thats fifty cents.'),
    ('Only 1¢ each.', 'Only one cent each.'),
    ('一支笔50¢。', '一支笔五十美分。'),
    ('The deal is worth £1.2bn.', 'The deal is worth one point two billion pounds.'),
]

# Degrees, minutes and seconds of arc and the hemisphere; a bare degree stays a unit.
ANGLES = [
    ('GPS坐标：31.2304°N，121.4737°E。', 'GPS坐标，北纬三十一点二三零四度，东经一百二十一点四七三七度。'),
    ('北纬39°54′。', '北纬三十九度五十四分。'),
    ('位于北纬40°26′46″，东经116°23′。', '位于北纬四十度二十六分四十六秒，东经一百一十六度二十三分。'),
    ('The summit is at 27°59′17″N.',
     'The summit is at twenty seven degrees fifty nine minutes seventeen seconds north.'),
    ('The ship was at 40°N, 70°W.', 'The ship was at forty degrees north, seventy degrees west.'),
    ("The angle is 30° 45'.", 'The angle is thirty degrees forty five minutes.'),
    ('Turn 45° left.', 'Turn forty five degrees left.'),
    ('角度为45°。', '角度为四十五度。'),
    ('气温45°C。', '气温四十五摄氏度。'),
]

# Feet and inches, minutes and seconds (a pace, a race time); a decade's apostrophe is no foot.
FEET_INCHES = [
    ('She is 5\'6".', 'She is five feet six inches.'),
    ('He is 6\'2" tall.', 'He is six feet two inches tall.'),
    ('他身高6′2″。', '他身高六英尺二英寸。'),
    ("In the '80s.", 'In the eighties.'),
    ("配速5'30''，很快。", '配速五分三十秒，很快。'),
    ('比赛用时1′05″。', '比赛用时一分五秒。'),
    ("My pace is 5'30'' per km.", 'My pace is five minutes thirty seconds per km.'),
]

# Caret exponents, two variables under one power and functions of one argument, never in English inside Chinese.
POWERS = [
    ('10^6', '十的六次方'),
    ('我们有2^10种组合。', '我们有二的十次方种组合。'),
    ('误差约为10^-3。', '误差约为十的负三次方。'),
    ('The answer is 2^10.', 'The answer is two to the power of ten.'),
    ('x^2+y^2=1', 'x的平方加y的平方等于一'),
    ('10^3米', '十的三次方米'),
    ('E = mc²', 'E equals m c squared'),
    ('爱因斯坦的质能方程E=mc²。', '爱因斯坦的质能方程E等于mc的平方。'),
    ('已知f(x)=x²，求f(2)。', '已知fx等于x的平方，求f二。'),
    ('Let f(x) = x² + 1.', 'Let f of x equals x squared plus one.'),
    ('面积5km²。', '面积五平方公里。'),
    ('The area is 25 m².', 'The area is twenty five square meters.'),
]

# Codes and identifiers: letters and numbers joined by hyphens, a number after an identifier word and #, a country
# code.
CODES = [
    ('商品编号：SKU-2024-001。', '商品编号，SKU杠二零二四杠零零幺。'),
    ('Invoice INV-2023-0042 is due.', 'Invoice INV dash two zero two three dash zero zero four two is due.'),
    ('订单号#12345。', '订单号幺二三四五。'),
    ('订单号：#12345。', '订单号，幺二三四五。'),
    ('Order #12345 has shipped.', 'Order number one two three four five has shipped.'),
    ('话题#世界杯#很热。', '话题世界杯很热。'),
    ('国际区号+1。', '国际区号加幺。'),
    ('美国的国际区号是+1。', '美国的国际区号是加幺。'),
    ('涨幅+3。', '涨幅正三。'),
    ('Please call 1-800-FLOWERS.', 'Please call one, eight zero zero, FLOWERS.'),
    ('请拨打1-800-FLOWERS。', '请拨打幺，八零零，FLOWERS。'),
    ('Dial 1-800-555-0199 for help.', 'Dial one, eight zero zero, five five five, zero one nine nine for help.'),
]

# A spaced x between numbers of an equation is its times sign.
SPACED_TIMES = [
    ('In maths, 3 x 4 = 12.', 'In maths, three times four equals twelve.'),
    ('我们知道3 x 4 = 12。', '我们知道三乘以四等于十二。'),
    ('2 x 3 x 4 = 24', '二乘以三乘以四等于二十四'),
    ('Solve x + 2 = 5.', 'Solve x plus two equals five.'),
]

# 两 only where a count is said: a chemical formula's digit is no count; a height's centimetres digit by digit.
NO_LIANG = [
    ('CO2排放。', 'CO二排放。'),
    ('CO₂排放量下降了5%。', 'CO二排放量下降了百分之五。'),
    ('2排座位。', '两排座位。'),
    ('身高1米75。', '身高一米七五。'),
    ('他身高1米65，体重60公斤。', '他身高一米六五，体重六十公斤。'),
    ('1米8的个子。', '一米八的个子。'),
    ('3米50厘米。', '三米五十厘米。'),
]

# No., p., pp. and other abbreviations before a number anywhere in the sentence; a.m. and p.m. alone unchanged.
ENGLISH_ABBREVIATIONS = [
    ('Item No. 5.', 'Item number five.'),
    ('Vol. 3, No. 2.', 'Volume three, number two.'),
    ('See p. 12.', 'See page twelve.'),
    ('See pp. 45-67.', 'See pages forty five to sixty seven.'),
    ('a.m. and p.m.', 'a. m. and p. m.'),
    ('See Ch. 3 and Eq. 5.', 'See Chapter three and Equation five.'),
    ('Call us at ext. 204.', 'Call us at extension two zero four.'),
    ('Tel. 010-12345678', 'Telephone zero one zero, one two three four five six seven eight'),
]

# A video resolution is named by its digits.
RESOLUTIONS = [
    ('1080P高清。', '一零八零P高清。'),
    ('支持2160p输出。', '支持二一六零P输出。'),
    ('The video is in 720p.', 'The video is in seven twenty p.'),
    ('I have 480 points.', 'I have four hundred and eighty points.'),
]

# A whole number and a proper fraction.
MIXED_NUMBERS = [
    ('Add 1 1/2 cups of water.', 'Add one and a half cups of water.'),
    ('It took 2 3/4 hours.', 'It took two and three quarters hours.'),
    ('About 1 1/3 miles.', 'About one and a third miles.'),
    ('加入1 1/2杯水。', '加入一又二分之一杯水。'),
    ('Mix 2 cups of flour with 1/2 cup of milk.', 'Mix two cups of flour with one half cup of milk.'),
]

# A year after a quarter, a half or a fiscal year, and alone in brackets after a title or a cited name; a count in
# brackets after a Chinese word stays one.
YEARS = [
    ('In Q1 2024, sales grew 8%.', 'In Q one twenty twenty four, sales grew eight percent.'),
    ('FY2024 revenue rose.', 'FY twenty twenty four revenue rose.'),
    ('H2 2023 was weak.', 'H two twenty twenty three was weak.'),
    ('Q3 2024营收增长。', 'Q三二零二四营收增长。'),
    ('We shipped 2024 units in Q1.', 'We shipped two thousand and twenty four units in Q one.'),
    ('员工（2000）人。', '员工，两千，人。'),
    ('《流浪地球》（2019）是一部科幻片。', '流浪地球，二零一九，是一部科幻片。'),
    ('Smith (2020) showed this.', 'Smith, twenty twenty, showed this.'),
    ('人数（2000）', '人数，两千'),
    ('收入（3000元）。', '收入，三千元。'),
    ('宁德时代（300750）今日大涨。', '宁德时代，三零零七五零，今日大涨。'),
]

# Two times with am/pm joined by a dash are a range.
AM_PM_RANGES = [
    ('Open 9am-5pm.', 'Open nine AM to five PM.'),
    ('Open Mon–Fri 9am–5pm.', 'Open Monday to Friday nine AM to five PM.'),
    ('Open 9 a.m. - 5 p.m.', 'Open nine AM to five PM.'),
    ('营业时间9am-5pm。', '营业时间上午九点到下午五点。'),
    ('He left at 5 p.m. Then he came back.', 'He left at five PM. Then he came back.'),
]

# A dot before a name (.NET) is said, not a sentence end.
NAME_DOTS = [
    ('使用.NET框架。', '使用 dot NET框架。'),
    ('We use .NET daily.', 'We use dot NET daily.'),
    ('我很好.Thanks a lot.', '我很好。Thanks a lot.'),
    ('See p. 12. Then go.', 'See page twelve. Then go.'),
    ('I said no. Then I left.', 'I said no. Then I left.'),
    ('他说完了.然后走了。', '他说完了。然后走了。'),
]


CASES = [*UNITS_BESIDE_UNITS, *MORE_UNITS, *ANGLES, *FEET_INCHES, *POWERS, *CODES, *NO_LIANG, *ENGLISH_ABBREVIATIONS,
         *RESOLUTIONS, *MIXED_NUMBERS, *YEARS, *AM_PM_RANGES, *NAME_DOTS, *SPACED_TIMES]


@pytest.mark.parametrize("library", [True, False])
@pytest.mark.parametrize("text, expected", CASES)
def test_a_replayed_neighbour_reads_as_a_listener_expects(text: str, expected: str, library: bool) -> None:
    result = normalize(text, library=library)
    assert result.text == expected
    assert_read(text, result)
