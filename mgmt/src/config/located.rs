//! A configuration value with where it was written: the byte range in the
//! text it was read from, for messages that name the line.
//!
//! A configuration file is read from text, and each value keeps its place
//! (TOML's spanned-value protocol, as `toml::Spanned` reads it). A
//! control-socket change is a document that was never text: rendering it
//! only to read it back costs more than everything else in a change, and
//! grows with the configuration. So the same value also reads from a
//! document (a `toml::Value`), with an empty place, and a change whose
//! check finds fault is read again from a rendering for the message's
//! place (see `TargetConfig::from_doc_reusing`).

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess};
use serde::de::{SeqAccess, Visitor};

/// `value`, written at `span` of the text it was read from (an empty span
/// at 0: read from a document, or made up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    span: Range<usize>,
    value: T,
}

impl<T> Located<T> {
    /// Byte range of the value in the text.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    /// The value.
    pub fn get_ref(&self) -> &T {
        &self.value
    }

    /// The value, taken.
    pub fn into_inner(self) -> T {
        self.value
    }
}

// The names of TOML's spanned-value protocol (serde_spanned's, as toml
// reads it): a reader of text that sees a struct of this name and these
// fields answers with a map of the value's start, its end and the value.
// `from_text_a_value_keeps_its_place` fails if they drift apart.
const START: &str = "$__serde_spanned_private_start";
const END: &str = "$__serde_spanned_private_end";
const VALUE: &str = "$__serde_spanned_private_value";
const NAME: &str = "$__serde_spanned_private_Spanned";
const FIELDS: &[&str] = &[START, END, VALUE];

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct(NAME, FIELDS, LocatedVisitor(PhantomData))
    }
}

struct LocatedVisitor<T>(PhantomData<T>);

impl<T> LocatedVisitor<T> {
    fn unplaced(value: T) -> Located<T> {
        Located { span: 0..0, value }
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for LocatedVisitor<T> {
    type Value = Located<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a configuration value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // Text: the spanned-value map. A document: the value's own table,
        // whose first key has been read to tell the two apart.
        let Some(first) = map.next_key::<String>()? else {
            let none = de::value::MapDeserializer::<_, A::Error>::new(std::iter::empty::<(
                String,
                String,
            )>());
            return T::deserialize(none).map(Self::unplaced);
        };
        if first != START {
            let rest = KeyThenRest {
                first: Some(first),
                rest: map,
            };
            return T::deserialize(de::value::MapAccessDeserializer::new(rest)).map(Self::unplaced);
        }
        let start: usize = map.next_value()?;
        let end = match map.next_key::<String>()? {
            Some(k) if k == END => map.next_value::<usize>()?,
            _ => return Err(de::Error::missing_field(END)),
        };
        match map.next_key::<String>()? {
            Some(k) if k == VALUE => {}
            _ => return Err(de::Error::missing_field(VALUE)),
        }
        let value = map.next_value()?;
        Ok(Located {
            span: start..end,
            value,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Self::unplaced)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Self::unplaced)
    }
}

/// A map whose first key was read already: that key, then the rest.
struct KeyThenRest<A> {
    first: Option<String>,
    rest: A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for KeyThenRest<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.first.take() {
            Some(key) => seed.deserialize(key.into_deserializer()).map(Some),
            None => self.rest.next_key_seed(seed),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        self.rest.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Lun {
        id: Located<u16>,
        path: Option<Located<String>>,
        flags: Option<Located<Vec<bool>>>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        name: Located<String>,
        lun: Vec<Located<Lun>>,
    }

    const TEXT: &str = "name = \"t\"\n[[lun]]\nid = 3\npath = \"/d.img\"\nflags = [true]\n";

    #[test]
    fn from_text_a_value_keeps_its_place() {
        let d: Doc = toml::from_str(TEXT).unwrap();
        assert_eq!(&TEXT[d.name.span()], "\"t\"");
        let lun = d.lun[0].get_ref();
        assert_eq!(&TEXT[lun.id.span()], "3");
        assert_eq!(&TEXT[lun.path.as_ref().unwrap().span()], "\"/d.img\"");
        assert_eq!(*lun.id.get_ref(), 3);
    }

    #[test]
    fn from_a_document_the_same_values_without_places() {
        let text: Doc = toml::from_str(TEXT).unwrap();
        let doc: toml::Table = TEXT.parse().unwrap();
        let d: Doc = toml::Value::Table(doc).try_into().unwrap();
        assert_eq!(d.name.span(), 0..0);
        assert_eq!(d.lun[0].span(), 0..0);
        let (a, b) = (text.lun[0].get_ref(), d.lun[0].get_ref());
        assert_eq!(a.id.get_ref(), b.id.get_ref());
        assert_eq!(a.path.as_ref().unwrap().get_ref(), "/d.img");
        assert_eq!(b.path.as_ref().unwrap().get_ref(), "/d.img");
        assert_eq!(b.flags.as_ref().unwrap().get_ref(), &vec![true]);
    }

    #[test]
    fn a_document_is_held_to_the_same_rules() {
        for bad in [
            "name = \"t\"\nlun = []\nextra = 1\n",
            "name = \"t\"\n[[lun]]\nid = 70000\n",
            "name = \"t\"\n[[lun]]\nid = \"3\"\n",
            "name = 5\nlun = []\n",
            "[[lun]]\nid = 1\n",
        ] {
            let doc: toml::Table = bad.parse().unwrap();
            assert!(toml::from_str::<Doc>(bad).is_err(), "{bad}");
            assert!(toml::Value::Table(doc).try_into::<Doc>().is_err(), "{bad}");
        }
    }
}
